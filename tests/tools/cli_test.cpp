// The attnplan CLI end to end, as a user runs it: real processes, a temporary cache, no GPU.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_testing.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using namespace attnplan::cli_testing;

// Runs `attnplan ARGS` with ATTNPLAN_CACHE_DIR=cache (unless empty), capturing stdout and stderr.
Result run(const fs::path& scratch, const std::string& cache, const std::vector<std::string>& args) {
  return run_cli(
      scratch, args,
      cache.empty() ? std::vector<std::string>{} : std::vector<std::string>{"ATTNPLAN_CACHE_DIR=" + cache});
}

std::string plan(const std::string& name) {
  return plan_path(name);
}

}  // namespace

TEST_CASE("every command has --help and bad usage exits 1", "[cli]") {
  attnplan::testing::TempDir scratch;
  CHECK(run(scratch.path(), "", {"--help"}).exit_code == 0);
  for (const std::string command : {"compile", "validate", "cache"}) {
    const Result help = run(scratch.path(), "", {command, "--help"});
    INFO(command);
    CHECK(help.exit_code == 0);
    CHECK(contains(help.out, "usage: attnplan " + command));
  }
  CHECK(run(scratch.path(), "", {"frobnicate"}).exit_code == 1);
  const Result unknown = run(scratch.path(), "", {"compile", plan("llama-3.1-8b.json"), "--no-such-flag"});
  CHECK(unknown.exit_code == 1);
  CHECK(contains(unknown.err, "unknown option --no-such-flag"));
  CHECK(run(scratch.path(), "", {"compile"}).exit_code == 1);
  const Result bad_arch = run(scratch.path(), (scratch / "cache").string(),
                              {"compile", plan("llama-3.1-8b.json"), "--arch", "sm_7x"});
  CHECK(bad_arch.exit_code == 1);
  CHECK(contains(bad_arch.err, "--arch sm_7x"));
  // A real arch the kernels cannot target is refused by config::arch_problem's rule before anything is
  // compiled, not by NVRTC (which failed with exit 2 and a page of ptxas errors), and so is every arch of a
  // list when one is unsupported: nothing is compiled and nothing cached.
  for (const std::vector<std::string>& unsupported :
       {std::vector<std::string>{"compile", plan("llama-3.1-8b.json"), "--arch", "sm_75"},
        std::vector<std::string>{"compile", plan("llama-3.1-8b.json"), "--arch", "sm_80,sm_80a"},
        std::vector<std::string>{"cache", "explain", plan("llama-3.1-8b.json"), "--arch", "sm_70"}}) {
    const Result refused = run(scratch.path(), (scratch / "cache").string(), unsupported);
    INFO(refused.err);
    CHECK(refused.exit_code == 1);
    CHECK(contains(refused.err, "input error: --arch sm_"));
    CHECK((contains(refused.err, "is not supported: the kernels need sm_80 or newer") ||
           contains(refused.err, "sm_80a does not exist")));
    CHECK_FALSE(contains(refused.err, "ptxas"));
  }
  CHECK_FALSE(std::filesystem::exists(scratch / "cache" / "v1"));
}

TEST_CASE("compile then compile again: all misses, then all hits", "[cli]") {
  attnplan::testing::TempDir scratch;
  const std::string cache = (scratch / "cache").string();
  const Result first = run(scratch.path(), cache, {"compile", plan("llama-3.1-8b.json"), "--json"});
  REQUIRE(first.exit_code == 0);
  const nlohmann::json cold = nlohmann::json::parse(first.out);
  CHECK(cold["arch"] == "sm_90a");       // no device here: auto means sm_90a
  REQUIRE(cold["kernels"].size() == 8);  // sm_90a: both projections have a small-M specialization
  for (const auto& kernel : cold["kernels"]) {
    CHECK(kernel["cache"] == "miss");
    CHECK(kernel["key"].get<std::string>().size() == 64);
    CHECK(kernel["registers"].get<int>() > 0);
    CHECK(kernel["spill_bytes"].get<int>() == 0);
    CHECK(kernel["compile_ms"].get<double>() > 0);
    CHECK(kernel.contains("shared_bytes"));
  }
  CHECK(contains(first.err, "compiling input_rmsnorm"));  // progress goes to stderr

  const Result second = run(scratch.path(), cache, {"compile", plan("llama-3.1-8b.json"), "--json"});
  REQUIRE(second.exit_code == 0);
  const nlohmann::json warm = nlohmann::json::parse(second.out);
  for (std::size_t i = 0; i < warm["kernels"].size(); ++i) {
    CHECK(warm["kernels"][i]["cache"] == "hit");
    CHECK(warm["kernels"][i]["key"] == cold["kernels"][i]["key"]);
  }

  const Result table = run(scratch.path(), cache, {"compile", plan("llama-3.1-8b.json")});
  REQUIRE(table.exit_code == 0);
  CHECK(contains(table.out, "input_rmsnorm"));
  CHECK(contains(table.out, "kv_store"));
  CHECK(contains(table.out, "8 cached, 0 compiled"));

  const Result other_arch =
      run(scratch.path(), cache, {"compile", plan("llama-3.1-8b.json"), "--json", "--arch", "sm_80"});
  REQUIRE(other_arch.exit_code == 0);
  CHECK(nlohmann::json::parse(other_arch.out)["kernels"][0]["cache"] == "miss");
}

TEST_CASE("bad configs exit 1 with every problem and its JSON path", "[cli]") {
  attnplan::testing::TempDir scratch;
  const fs::path bad = scratch / "bad.json";
  std::ofstream(bad) << R"({"schema": "attnplan/v1", "hidden_size": 4096, "query_heads": 32, "kv_heads": 5,
                            "rotary": {"dim": 64, "pairing_dim": 6}, "sliding_windw": 4096})";
  for (const std::string command : {"validate", "compile"}) {
    const Result result = run(scratch.path(), (scratch / "cache").string(), {command, bad.string()});
    INFO(command << "\n" << result.err);
    CHECK(result.exit_code == 1);
    CHECK(contains(result.err, "/kv_heads"));
    CHECK(contains(result.err, "/rotary/pairing_dim"));
    CHECK(contains(result.err, "/sliding_windw"));
  }
  CHECK_FALSE(fs::exists(scratch / "cache" / "v1"));  // nothing compiled, nothing written

  const Result missing = run(scratch.path(), "", {"validate", (scratch / "nope.json").string()});
  CHECK(missing.exit_code == 1);
  const Result good = run(scratch.path(), "", {"validate", plan("qwen3-8b.json")});
  CHECK(good.exit_code == 0);
  CHECK(contains(good.out, "valid"));
}

TEST_CASE("cache tools on a directory that is not there say so and create nothing", "[cli]") {
  attnplan::testing::TempDir scratch;
  const fs::path absent = scratch / "no-such-cache";
  for (const std::vector<std::string>& action :
       {std::vector<std::string>{"cache", "list"}, std::vector<std::string>{"cache", "verify"},
        std::vector<std::string>{"cache", "prune", "--max-bytes", "0"},
        std::vector<std::string>{"cache", "clear"}}) {
    const Result result = run(scratch.path(), absent.string(), action);
    INFO(action[1]);
    CHECK(result.exit_code == 0);
    CHECK(result.out == "no cache at " + absent.string() + " (the directory does not exist)\n");
  }
  const Result show = run(scratch.path(), absent.string(), {"cache", "show", "ab12"});
  CHECK(show.exit_code == 1);
  CHECK(contains(show.err, "input error: no cache at " + absent.string()));
  // Bad input is still bad input there.
  CHECK(run(scratch.path(), absent.string(), {"cache", "prune", "--max-bytes", "lots"}).exit_code == 1);
  CHECK_FALSE(fs::exists(absent));
}

TEST_CASE("cache tools: path, list, show, verify, a corrupted entry rebuilt, prune, clear", "[cli]") {
  attnplan::testing::TempDir scratch;
  const std::string cache = (scratch / "cache").string();
  const Result compiled =
      run(scratch.path(), cache, {"compile", plan("mistral-7b.json"), "--json", "--keep-ptx"});
  REQUIRE(compiled.exit_code == 0);
  const std::string key = nlohmann::json::parse(compiled.out)["kernels"][0]["key"];

  CHECK(run(scratch.path(), cache, {"cache", "path"}).out == cache + "\n");
  const Result list = run(scratch.path(), cache, {"cache", "list"});
  CHECK(list.exit_code == 0);
  CHECK(contains(list.out, key.substr(0, 16)));
  CHECK(contains(list.out, "8 entries"));  // sm_90a: each projection twice

  const Result manifest = run(scratch.path(), cache, {"cache", "show", key.substr(0, 10), "--manifest"});
  REQUIRE(manifest.exit_code == 0);
  const nlohmann::json parsed = nlohmann::json::parse(manifest.out);
  CHECK(parsed["key"] == key);
  CHECK(parsed.contains("lowered_name"));
  CHECK(parsed.contains("resources"));
  const Result ptx = run(scratch.path(), cache, {"cache", "show", key, "--ptx"});
  CHECK(ptx.exit_code == 0);
  CHECK(contains(ptx.out, ".version"));
  const Result summary = run(scratch.path(), cache, {"cache", "show", key});
  CHECK(contains(summary.out, "registers"));
  CHECK(run(scratch.path(), cache, {"cache", "show", "ffffffffffff"}).exit_code == 1);
  const Result sass = run(scratch.path(), cache, {"cache", "show", key, "--sass"});
  CHECK((sass.exit_code == 0 || contains(sass.err, "no SASS disassembler found")));

  CHECK(run(scratch.path(), cache, {"cache", "verify"}).exit_code == 0);

  // Flip one byte of a cubin: verify reports it, the next compile warns, rebuilds it, and all is clean.
  fs::path cubin;
  for (const auto& file : fs::recursive_directory_iterator(cache)) {
    if (file.path().filename() == key + ".cubin") cubin = file.path();
  }
  REQUIRE_FALSE(cubin.empty());
  // --cubin writes the entry's bytes as stored; a path it cannot write is an error, not a crash.
  const fs::path exported = scratch / "exported.cubin";
  const Result exported_run =
      run(scratch.path(), cache, {"cache", "show", key.substr(0, 12), "--cubin", exported.string()});
  CHECK(exported_run.exit_code == 0);
  CHECK(exported_run.out == exported.string() + "\n");
  CHECK(read_all(exported) == read_all(cubin));
  CHECK(
      run(scratch.path(), cache, {"cache", "show", key, "--cubin", (scratch / "absent" / "x.cubin").string()})
          .exit_code == 1);
  CHECK_FALSE(fs::exists(scratch / "absent"));  // nor made
  {
    std::fstream stream(cubin, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekg(100);
    const char original = static_cast<char>(stream.get());
    stream.seekp(100);
    stream.put(static_cast<char>(original ^ 0x5a));
  }
  const Result bad = run(scratch.path(), cache, {"cache", "verify"});
  CHECK(bad.exit_code == 1);
  CHECK(contains(bad.out, key));
  const Result rebuilt = run(scratch.path(), cache, {"compile", plan("mistral-7b.json"), "--json"});
  REQUIRE(rebuilt.exit_code == 0);
  CHECK(nlohmann::json::parse(rebuilt.out)["kernels"][0]["cache"] == "miss");
  CHECK(contains(rebuilt.err, key));  // the warning names the entry it quarantined
  CHECK(run(scratch.path(), cache, {"cache", "verify"}).exit_code == 0);

  CHECK(run(scratch.path(), cache, {"cache", "prune", "--max-bytes", "0"}).exit_code == 0);
  CHECK(contains(run(scratch.path(), cache, {"cache", "list"}).out, "0 entries"));
  REQUIRE(run(scratch.path(), cache, {"compile", plan("mistral-7b.json")}).exit_code == 0);
  CHECK(run(scratch.path(), cache, {"cache", "clear"}).exit_code == 0);
  CHECK(contains(run(scratch.path(), cache, {"cache", "list"}).out, "0 entries"));
}

namespace {

// <key>.cubin file name -> bytes, for every cubin under a cache root.
std::map<std::string, std::string> cubins_under(const fs::path& root) {
  std::map<std::string, std::string> cubins;
  for (const auto& item : fs::recursive_directory_iterator(root)) {
    if (item.path().extension() == ".cubin" && item.path().parent_path().filename() != "quarantine")
      cubins[item.path().filename().string()] = read_all(item.path());
  }
  return cubins;
}

}  // namespace

// Overlapping sets: process i compiles plans i % 3 and (i + 1) % 3, so every plan is built by several
// processes at once and llama/mistral share kernels besides; the serial compile of all three is the
// reference for the bytes. Hidden from the default run (about a minute of NVRTC on 2 cores): CTest runs
// it as its own test, tools_concurrency.
TEST_CASE("8 processes compiling overlapping plans into one empty cache agree with a serial compile",
          "[.][cli][concurrency]") {
  constexpr int kProcesses = 8;
  attnplan::testing::TempDir scratch;
  const std::vector<std::string> plans{plan("llama-3.1-8b.json"), plan("mistral-7b.json"),
                                       plan("qwen3-8b.json")};
  const std::string shared = (scratch / "shared").string(), serial = (scratch / "serial").string();

  std::vector<FILE*> processes;
  for (int i = 0; i < kProcesses; ++i) {
    const std::string command = "ATTNPLAN_CACHE_DIR=" + quote(shared) + " " + quote(ATTNPLAN_CLI_PATH) +
                                " compile " + quote(plans[i % 3]) + " " + quote(plans[(i + 1) % 3]) +
                                " --arch sm_90a --json 2>" +
                                quote((scratch / ("err" + std::to_string(i))).string());
    processes.push_back(popen(command.c_str(), "r"));
  }
  std::set<std::string> keys;
  for (int i = 0; i < kProcesses; ++i) {
    INFO("process " << i << ": " << read_all(scratch / ("err" + std::to_string(i))));
    REQUIRE(processes[i] != nullptr);
    std::string output;
    char buffer[4096];
    while (std::size_t n = fread(buffer, 1, sizeof buffer, processes[i])) output.append(buffer, n);
    const int status = pclose(processes[i]);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    const nlohmann::json results = nlohmann::json::parse(output, nullptr, false);
    REQUIRE(results.is_array());
    for (const auto& result : results) {
      for (const auto& kernel : result["kernels"]) keys.insert(kernel["key"].get<std::string>());
    }
  }
  const Result verify = run(scratch.path(), shared, {"cache", "verify"});
  INFO(verify.out << verify.err);
  CHECK(verify.exit_code == 0);
  // No temp file of any publish is left, and no entry went to quarantine (nobody saw a half entry).
  for (const auto& item : fs::recursive_directory_iterator(shared)) {
    INFO(item.path().string());
    CHECK_FALSE(item.path().filename().string().starts_with("."));
    CHECK(item.path().filename() != "quarantine");
  }

  REQUIRE(
      run(scratch.path(), serial, {"compile", plans[0], plans[1], plans[2], "--arch", "sm_90a"}).exit_code ==
      0);
  const std::map<std::string, std::string> concurrent_cubins = cubins_under(shared);
  const std::map<std::string, std::string> serial_cubins = cubins_under(serial);
  CHECK(concurrent_cubins.size() == keys.size());
  CHECK(concurrent_cubins == serial_cubins);  // the same keys, each with byte-identical bytes
}

TEST_CASE("an unwritable cache directory degrades to in-memory compiles with one warning", "[cli]") {
  attnplan::testing::TempDir scratch;
  std::ofstream(scratch / "a-file") << "not a directory";
  const std::string cache = (scratch / "a-file" / "cache").string();
  const Result result = run(scratch.path(), cache, {"compile", plan("llama-3.1-8b.json"), "--json"});
  REQUIRE(result.exit_code == 0);
  CHECK(nlohmann::json::parse(result.out)["kernels"].size() == 8);
  std::size_t warnings = 0;
  for (std::size_t at = result.err.find("warning"); at != std::string::npos;
       at = result.err.find("warning", at + 1)) {
    ++warnings;
  }
  CHECK(warnings == 1);
}
