// `attnplan cache explain`, multi-config / multi-arch `compile` and a prebuilt pack used through
// ATTNPLAN_CACHE_PATH with ATTNPLAN_JIT=off: real processes, temporary caches, no GPU.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `env VARS... attnplan ARGS` (VARS as NAME=value), stdout and stderr captured in `scratch`.
Outcome run_cli(const fs::path& scratch, const std::vector<std::string>& variables,
                const std::vector<std::string>& args) {
  static int runs = 0;
  const fs::path out = scratch / ("explain-out" + std::to_string(runs));
  const fs::path err = scratch / ("explain-err" + std::to_string(runs++));
  std::string command = "env";
  for (const std::string& variable : variables) command += " " + shell_quote(variable);
  command += " " + shell_quote(ATTNPLAN_CLI_PATH);
  for (const std::string& arg : args) command += " " + shell_quote(arg);
  command += " >" + shell_quote(out.string()) + " 2>" + shell_quote(err.string());
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_all(out), read_all(err)};
}

std::string plan_file(const std::string& name) {
  return std::string(ATTNPLAN_SOURCE_DIR) + "/plans/" + name;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t count = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

}  // namespace

TEST_CASE("cache explain: no entry, then hits, then the differing input of another arch", "[cli][explain]") {
  attnplan::testing::TempDir scratch;
  const std::vector<std::string> env = {"ATTNPLAN_CACHE_DIR=" + (scratch / "cache").string()};
  const std::string llama = plan_file("llama-3.1-8b.json");

  const Outcome empty = run_cli(scratch.path(), env, {"cache", "explain", llama, "--arch", "sm_80"});
  INFO(empty.err);
  REQUIRE(empty.exit_code == 0);
  CHECK(count_of(empty.out, "no entry of this kernel in the cache") == 6);
  CHECK(has(empty.out, "0 would be found, 6 would be compiled"));

  REQUIRE(run_cli(scratch.path(), env, {"compile", llama, "--arch", "sm_80"}).exit_code == 0);
  const Outcome hit = run_cli(scratch.path(), env, {"cache", "explain", llama, "--arch", "sm_80"});
  REQUIRE(hit.exit_code == 0);
  CHECK(has(hit.out, "6 would be found, 0 would be compiled"));
  CHECK(count_of(hit.out, " hit ") == 6);

  const Outcome other = run_cli(scratch.path(), env, {"cache", "explain", llama, "--arch", "sm_90a"});
  REQUIRE(other.exit_code == 0);
  CHECK(has(other.out, "0 would be found, 8 would be compiled"));
  // The nearest entry is the sm_80 build; the two projections are another kernel (wgmma) on sm_90a, and
  // o_proj's small-M specialization exists only there.
  CHECK(count_of(other.out, "arch: sm_80 -> sm_90a") == 4);
  CHECK(count_of(other.out, "no entry of this kernel in the cache") == 4);

  // --json says the same per kernel, with full keys.
  const std::vector<std::string> json_at_80 = {"cache", "explain", llama, "--arch", "sm_80", "--json"};
  const Outcome hit_json = run_cli(scratch.path(), env, json_at_80);
  REQUIRE(hit_json.exit_code == 0);
  const nlohmann::json hits = nlohmann::json::parse(hit_json.out);
  CHECK(hits["arch"] == "sm_80");
  CHECK(hits["cache_dir"] == (scratch / "cache").string());
  CHECK(hits["tiers"].empty());
  CHECK(hits["found"] == 6);
  CHECK(hits["compiled"] == 0);
  REQUIRE(hits["kernels"].size() == 6);
  for (const auto& kernel : hits["kernels"]) {
    CHECK(kernel["cache"] == "hit");
    CHECK(kernel["key"].get<std::string>().size() == 64);
    CHECK(has(hit.out, kernel["key"].get<std::string>().substr(0, 12)));  // the table's key column
    CHECK(kernel["directory"].is_string());
    CHECK_FALSE(kernel.contains("nearest"));
  }
  const Outcome other_json =
      run_cli(scratch.path(), env, {"cache", "explain", llama, "--arch", "sm_90a", "--json"});
  REQUIRE(other_json.exit_code == 0);
  const nlohmann::json misses = nlohmann::json::parse(other_json.out);
  CHECK(misses["found"] == 0);
  CHECK(misses["compiled"] == 8);
  int nearest_at_80 = 0, without_entry = 0;
  for (const auto& kernel : misses["kernels"]) {
    CHECK(kernel["cache"] == "miss");
    CHECK_FALSE(kernel.contains("directory"));
    if (kernel["nearest"].is_null()) {
      ++without_entry;
    } else {
      const auto& differences = kernel["nearest"]["differences"];
      if (std::find(differences.begin(), differences.end(), "arch: sm_80 -> sm_90a") != differences.end())
        ++nearest_at_80;
      CHECK(kernel["nearest"]["key"].get<std::string>().size() == 64);
    }
  }
  CHECK(nearest_at_80 == 4);
  CHECK(without_entry == 4);  // the two wgmma projections and their small-M ones

  CHECK(run_cli(scratch.path(), env, {"cache", "explain"}).exit_code == 1);
  CHECK(run_cli(scratch.path(), env, {"cache", "explain", plan_file("no-such.json")}).exit_code == 1);
  CHECK(run_cli(scratch.path(), env, {"cache", "explain", llama, "--arch", "sm_7x"}).exit_code == 1);
}

TEST_CASE("a prebuilt pack over two plans and two archs serves a JIT-off compile", "[cli][explain][tiers]") {
  attnplan::testing::TempDir scratch;
  const std::string pack = (scratch / "pack").string();
  const std::vector<std::string> plans = {plan_file("llama-3.1-8b.json"), plan_file("qwen3-8b.json")};

  std::vector<std::string> build = {"compile", "--arch", "sm_80,sm_90a"};
  build.insert(build.end(), plans.begin(), plans.end());
  build.insert(build.end(), {"--cache-dir", pack, "--json"});
  const Outcome built = run_cli(scratch.path(), {}, build);
  INFO(built.err);
  REQUIRE(built.exit_code == 0);
  const nlohmann::json results = nlohmann::json::parse(built.out);
  REQUIRE(results.is_array());
  REQUIRE(results.size() == 4);  // (config, arch) pairs, arch-major
  CHECK(results[0]["arch"] == "sm_80");
  CHECK(results[0]["config"] == plans[0]);
  CHECK(results[1]["config"] == plans[1]);
  CHECK(results[3]["arch"] == "sm_90a");
  for (const auto& result : results)  // sm_90a: o_proj's small-M specialization too
    CHECK(result["kernels"].size() == (result["arch"] == "sm_90a" ? 8u : 6u));

  // A fresh writable dir, the pack read-only, compiling forbidden: everything comes from the pack.
  const std::vector<std::string> env = {"ATTNPLAN_CACHE_DIR=" + (scratch / "local").string(),
                                        "ATTNPLAN_CACHE_PATH=" + pack, "ATTNPLAN_JIT=off"};
  std::vector<std::string> use = {"compile", "--arch", "sm_80,sm_90a"};
  use.insert(use.end(), plans.begin(), plans.end());
  use.push_back("--json");
  const Outcome served = run_cli(scratch.path(), env, use);
  INFO(served.err);
  REQUIRE(served.exit_code == 0);
  const nlohmann::json prebuilt = nlohmann::json::parse(served.out);
  REQUIRE(prebuilt.size() == 4);
  for (std::size_t i = 0; i < prebuilt.size(); ++i) {
    INFO(prebuilt[i]["config"] << " " << prebuilt[i]["arch"]);
    for (std::size_t k = 0; k < prebuilt[i]["kernels"].size(); ++k) {
      const std::string lookup = prebuilt[i]["kernels"][k]["cache"];
      // The second plan shares some kernels with the first, already loaded by this process.
      CHECK((lookup == "prebuilt" || (i % 2 == 1 && lookup == "memory")));
      CHECK(prebuilt[i]["kernels"][k]["key"] == results[i]["kernels"][k]["key"]);
    }
  }
  std::size_t local_files = 0;  // every kernel came from the pack: nothing copied, locked or published
  for (const auto& item : fs::recursive_directory_iterator(scratch / "local"))
    local_files += item.is_regular_file();
  CHECK(local_files == 0);

  // One config, one arch: still the single object; the table names the tier.
  const Outcome single = run_cli(scratch.path(), env, {"compile", plans[1], "--arch", "sm_90a", "--json"});
  REQUIRE(single.exit_code == 0);
  const nlohmann::json object = nlohmann::json::parse(single.out);
  CHECK(object.is_object());
  for (const auto& kernel : object["kernels"]) CHECK(kernel["cache"] == "prebuilt");
  const Outcome table = run_cli(scratch.path(), env, {"compile", plans[1], "--arch", "sm_90a"});
  CHECK(has(table.out, "prebuilt"));
  CHECK(has(table.out, pack + " (read-only)"));

  const Outcome explained = run_cli(scratch.path(), env, {"cache", "explain", plans[0], "--arch", "sm_80"});
  REQUIRE(explained.exit_code == 0);
  CHECK(count_of(explained.out, " prebuilt ") == 6);

  // JIT off and a kernel the pack lacks: a compile error naming the kernel; exit 2.
  const Outcome missing =
      run_cli(scratch.path(), env, {"compile", plan_file("gpt-j-6b.json"), "--arch", "sm_80"});
  CHECK(missing.exit_code == 2);
  CHECK(has(missing.err, "is not prebuilt or cached"));
  CHECK(has(missing.err, pack));

  CHECK(run_cli(scratch.path(), {"ATTNPLAN_JIT=sometimes"}, {"compile", plans[0]}).exit_code == 1);
  CHECK(run_cli(scratch.path(), {}, {"compile", plans[0], "--jit", "sometimes"}).exit_code == 1);
}
