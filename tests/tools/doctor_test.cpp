// attnplan doctor end to end: the real binary, a temporary cache, whatever driver this machine has.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_testing.hpp"
#include "core/error.hpp"
#include "driver/cuda_api.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using namespace attnplan::cli_testing;

bool has_text(const std::string& text, const std::string& part) {
  return contains(text, part);
}

// Whether libcuda loads in this process: the doctor must say "no CUDA driver" exactly when it does not.
bool driver_loads() {
  try {
    attnplan::driver::api();
    return true;
  } catch (const attnplan::Error&) {
    return false;
  }
}

}  // namespace

TEST_CASE("doctor reports every section and exits 0 where compiling works", "[cli][doctor]") {
  attnplan::testing::TempDir scratch;
  const fs::path cache = scratch / "cache";
  const Result json = run_cli(scratch.path(), {"doctor", "--cache-dir", cache.string(), "--json"});
  INFO(json.out << json.err);
  REQUIRE(json.exit_code == 0);
  const nlohmann::json report = nlohmann::json::parse(json.out);
  CHECK(report["ok"] == true);
  CHECK(report["problems"].empty());

  CHECK(report["toolkit"]["found"] == true);
  CHECK(fs::is_directory(report["toolkit"]["root"].get<std::string>()));
  CHECK_FALSE(report["toolkit"]["include_dirs"].empty());
  CHECK(report["toolkit"]["cuda_bf16_h"] == true);
  CHECK(report["toolkit"].contains("cccl"));
  CHECK_FALSE(report["nvrtc"]["version"].get<std::string>().empty());
  CHECK(report["templates"]["origin"] == "embedded");
  CHECK(report["templates"]["headers"].get<int>() > 0);

  const nlohmann::json& driver = report["driver"];
  if (!driver_loads()) {
    CHECK(driver["available"] == false);
    CHECK(driver["status"] == "no CUDA driver");
    CHECK(has_text(driver["reason"].get<std::string>(), "libcuda"));
  } else if (driver["available"] == true) {
    CHECK_FALSE(driver["device"]["name"].get<std::string>().empty());
    CHECK(driver["device"]["multiprocessors"].get<int>() > 0);
  }

  // The cache does not exist yet: reported, not created.
  CHECK(report["cache"]["directory"] == cache.string());
  CHECK(report["cache"]["exists"] == false);
  CHECK(report["cache"]["writable"] == true);
  CHECK(report["cache"]["entries"] == 0);
  CHECK(report["cache"]["free_bytes"].get<std::uint64_t>() > 0);
  CHECK(report["cache"].contains("max_bytes"));
  CHECK_FALSE(fs::exists(cache));

  const Result table = run_cli(scratch.path(), {"doctor", "--cache-dir", cache.string()});
  CHECK(table.exit_code == 0);
  for (const std::string row :
       {"toolkit", "cuda_bf16.h", "nvrtc", "templates", "driver", "cache", "free disk"}) {
    CHECK(has_text(table.out, row));
  }
  if (!driver_loads()) CHECK(has_text(table.out, "no CUDA driver"));
}

TEST_CASE("doctor counts the entries a compile put into the cache", "[cli][doctor]") {
  attnplan::testing::TempDir scratch;
  const std::string cache = (scratch / "cache").string();
  const std::string config = std::string(ATTNPLAN_SOURCE_DIR) + "/plans/llama-3.1-8b.json";
  REQUIRE(run_cli(scratch.path(), {"compile", config, "--cache-dir", cache, "--json"}).exit_code == 0);

  const Result json = run_cli(scratch.path(), {"doctor", "--cache-dir", cache, "--json"});
  REQUIRE(json.exit_code == 0);
  const nlohmann::json report = nlohmann::json::parse(json.out);
  CHECK(report["cache"]["exists"] == true);
  CHECK(report["cache"]["writable"] == true);
  CHECK(report["cache"]["entries"] == 8);  // sm_90a: 6 stages, each projection twice
  CHECK(report["cache"]["total_bytes"].get<std::uint64_t>() > 0);
}

TEST_CASE("doctor exits 2 when the toolkit headers are missing", "[cli][doctor]") {
  attnplan::testing::TempDir scratch;
  // An explicit root is authoritative, so an empty directory stands for a machine without the headers.
  const Result json = run_cli(scratch.path(), {"doctor", "--cuda-root", scratch.path().string(),
                                               "--cache-dir", (scratch / "cache").string(), "--json"});
  CHECK(json.exit_code == 2);
  const nlohmann::json report = nlohmann::json::parse(json.out);
  CHECK(report["ok"] == false);
  CHECK(report["toolkit"]["found"] == false);
  CHECK(report["toolkit"]["cuda_bf16_h"] == false);
  CHECK_FALSE(report["toolkit"]["error"].get<std::string>().empty());
  CHECK_FALSE(report["problems"].empty());
}
