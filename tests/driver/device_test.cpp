#include "driver/device.hpp"

#include "driver/cuda_api.hpp"
#include "support/expect_error.hpp"
#include "support/catch.hpp"

namespace driver = attnplan::driver;

namespace {

std::string arch_of(int major, int minor) {
  driver::DeviceInfo info;
  info.major = major;
  info.minor = minor;
  return info.arch_name();
}

}  // namespace

TEST_CASE("arch_name picks the architecture-specific target for Hopper and Blackwell", "[driver][device]") {
  CHECK(arch_of(9, 0) == "sm_90a");
  CHECK(arch_of(10, 0) == "sm_100a");
}

TEST_CASE("arch_name is the plain target for every other architecture", "[driver][device]") {
  CHECK(arch_of(7, 5) == "sm_75");
  CHECK(arch_of(8, 0) == "sm_80");
  CHECK(arch_of(8, 6) == "sm_86");
  CHECK(arch_of(8, 9) == "sm_89");
  CHECK(arch_of(10, 3) == "sm_103");
  CHECK(arch_of(12, 0) == "sm_120");
}

TEST_CASE("device queries without a usable device fail with a driver error", "[driver][device]") {
  if (driver::device_available()) {
    const driver::DeviceInfo info = driver::query_device(0);
    CHECK(info.ordinal == 0);
    CHECK(!info.name.empty());
    CHECK(info.major >= 7);
    CHECK(info.multiprocessors > 0);
    CHECK(info.total_memory > 0);
    CHECK(info.driver_version >= 12000);
    const attnplan::Error error = expect_error([] { driver::query_device(driver::device_count()); });
    CHECK(error.stage() == attnplan::Stage::driver);
    CHECK(contains(error.message(), "does not exist"));
  } else {
    CHECK(expect_error([] { driver::device_count(); }).stage() == attnplan::Stage::driver);
    CHECK(expect_error([] { driver::query_device(0); }).stage() == attnplan::Stage::driver);
  }
}
