// The RAII wrappers' behaviour that needs no device: empty objects, argument checks done before any
// driver call, and failures when there is no driver. Their device behaviour is covered by the GPU tests.
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "driver/context.hpp"
#include "driver/cuda_api.hpp"
#include "driver/device.hpp"
#include "driver/event.hpp"
#include "driver/launch.hpp"
#include "driver/memory.hpp"
#include "driver/module.hpp"
#include "driver/stream.hpp"
#include "support/expect_error.hpp"
#include "support/catch.hpp"

using attnplan::Stage;
namespace driver = attnplan::driver;

// Owners move but never copy; Function is a copyable handle.
static_assert(!std::is_copy_constructible_v<driver::Context> &&
              std::is_nothrow_move_constructible_v<driver::Context>);
static_assert(!std::is_copy_constructible_v<driver::Module> &&
              std::is_nothrow_move_constructible_v<driver::Module>);
static_assert(!std::is_copy_constructible_v<driver::Stream> &&
              std::is_nothrow_move_constructible_v<driver::Stream>);
static_assert(!std::is_copy_constructible_v<driver::Event> &&
              std::is_nothrow_move_constructible_v<driver::Event>);
static_assert(!std::is_copy_constructible_v<driver::DeviceBuffer> &&
              std::is_nothrow_move_assignable_v<driver::DeviceBuffer>);
static_assert(std::is_copy_constructible_v<driver::Function>);
static_assert(std::is_nothrow_destructible_v<driver::Module> &&
              std::is_nothrow_destructible_v<driver::DeviceBuffer>);

TEST_CASE("a LaunchShape defaults to one block of one thread", "[driver][launch]") {
  const driver::LaunchShape shape;
  CHECK((shape.grid.x == 1 && shape.grid.y == 1 && shape.grid.z == 1));
  CHECK((shape.block.x == 1 && shape.block.y == 1 && shape.block.z == 1));
  CHECK(shape.dynamic_shared_bytes == 0);
  const driver::LaunchShape rows{{4096, 1, 1}, {256, 1, 1}, 0};
  CHECK(rows.grid.x == 4096);
  CHECK(rows.block.x == 256);
}

TEST_CASE("launching an empty Function is an internal error", "[driver][launch]") {
  struct Params {
    int value;
  };
  const driver::Function empty;
  CHECK(!empty);
  CHECK(expect_error([&] { driver::launch(empty, {}, nullptr, Params{1}); }).stage() == Stage::internal);
  CHECK(expect_error([&] { empty.num_regs(); }).stage() == Stage::internal);
  CHECK(expect_error([&] { empty.set_max_dynamic_shared_bytes(100 * 1024); }).stage() == Stage::internal);
}

TEST_CASE("an empty cubin is refused before the driver is asked", "[driver][module]") {
  const std::vector<std::uint8_t> nothing;
  const attnplan::Error error = expect_error([&] { driver::Module::load(nothing); });
  CHECK(error.stage() == Stage::driver);
  CHECK(contains(error.message(), "empty cubin"));
}

TEST_CASE("an empty DeviceBuffer needs no driver", "[driver][memory]") {
  driver::DeviceBuffer empty;
  CHECK(empty.address() == 0);
  CHECK(empty.size_bytes() == 0);
  driver::DeviceBuffer zero_bytes(0);  // an empty tensor allocates nothing
  CHECK(zero_bytes.address() == 0);
  const std::vector<float> none;
  zero_bytes.upload(none);
  CHECK(zero_bytes.download_all<float>().empty());
  zero_bytes.fill_bytes(0xff);
  driver::DeviceBuffer moved = std::move(zero_bytes);
  CHECK(moved.size_bytes() == 0);
}

TEST_CASE("copies that would leave the buffer are input errors", "[driver][memory]") {
  driver::DeviceBuffer empty;
  const std::array<float, 2> two{1.0f, 2.0f};
  const attnplan::Error error = expect_error([&] { empty.upload(two); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), "upload of 8 bytes at offset 0 leaves a device buffer of 0 bytes"));
  std::array<float, 2> out{};
  CHECK(expect_error([&] { empty.download(out, 4); }).stage() == Stage::input);
}

TEST_CASE("a borrowed stream is never destroyed", "[driver][stream]") {
  driver::Stream borrowed = driver::Stream::borrow(nullptr);
  CHECK(!borrowed.owned());
  CHECK(borrowed.handle() == nullptr);
  driver::Stream moved = std::move(borrowed);
  CHECK(!moved.owned());
}

TEST_CASE("without a device, creating resources fails with a driver error", "[driver][context]") {
  if (driver::device_available()) return;  // covered by the GPU tests
  CHECK(expect_error([] { driver::Context context(0); }).stage() == Stage::driver);
  CHECK(expect_error([] { driver::Stream::create(); }).stage() == Stage::driver);
  CHECK(expect_error([] { driver::Event::create(); }).stage() == Stage::driver);
  CHECK(expect_error([] { driver::DeviceBuffer buffer(64); }).stage() == Stage::driver);
  const std::vector<std::uint8_t> bytes(16, 0);
  CHECK(expect_error([&] { driver::Module::load(bytes); }).stage() == Stage::driver);
}
