#include "plan/arch_memo.hpp"

#include <fstream>

#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;

namespace {

// A /proc/driver/nvidia tree as the NVIDIA kernel module lays it out.
void fake_driver(const std::filesystem::path& proc, const std::string& version, const std::string& model) {
  const auto gpu = proc / "driver" / "nvidia" / "gpus" / "0000:19:00.0";
  std::filesystem::create_directories(gpu);
  std::ofstream(proc / "driver" / "nvidia" / "version") << version;
  std::ofstream(gpu / "information") << "Model: \t\t " << model << "\nBus Location: \t 0000:19:00.0\n";
}

}  // namespace

TEST_CASE("no NVIDIA kernel module: no identity, so auto is resolved without a memo", "[plan][arch_memo]") {
  testing::TempDir dir;
  CHECK_FALSE(plan::device_identity(dir.path(), 0, std::nullopt).has_value());
}

TEST_CASE("the identity changes with the driver, the GPUs, the ordinal and CUDA_VISIBLE_DEVICES",
          "[plan][arch_memo]") {
  testing::TempDir dir;
  fake_driver(dir.path(), "NVRM version: 580.159.04", "NVIDIA H200");
  const auto base = plan::device_identity(dir.path(), 0, std::nullopt);
  REQUIRE(base.has_value());
  CHECK(plan::device_identity(dir.path(), 0, std::nullopt) == base);
  CHECK(plan::device_identity(dir.path(), 1, std::nullopt) != base);
  CHECK(plan::device_identity(dir.path(), 0, std::string("1")) != base);
  fake_driver(dir.path(), "NVRM version: 590.10", "NVIDIA H200");
  CHECK(plan::device_identity(dir.path(), 0, std::nullopt) != base);
}

TEST_CASE("a remembered arch is found again, per identity, and a damaged memo is no memo",
          "[plan][arch_memo]") {
  testing::TempDir dir;
  const auto cache = dir.path() / "cache";
  CHECK_FALSE(plan::remembered_arch(cache, "abc").has_value());
  plan::remember_arch(cache, "abc", *config::parse_arch("sm_90a"));
  plan::remember_arch(cache, "def", *config::parse_arch("sm_80"));
  CHECK(plan::remembered_arch(cache, "abc")->name() == "sm_90a");
  CHECK(plan::remembered_arch(cache, "def")->name() == "sm_80");
  CHECK_FALSE(plan::remembered_arch(cache, "ghi").has_value());
  std::ofstream(cache / "devices.json") << "{ not json";
  CHECK_FALSE(plan::remembered_arch(cache, "abc").has_value());
  // An unwritable cache (a path under a regular file) forgets quietly.
  std::ofstream(dir.path() / "file") << "x";
  CHECK_NOTHROW(plan::remember_arch(dir.path() / "file" / "cache", "abc", *config::parse_arch("sm_90a")));
}
