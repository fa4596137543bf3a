// attnplan bench's command line: bad input exits 1 naming the option before any device work, and a
// machine without a usable CUDA device gets a clear "no CUDA device" error (exit 1).
#include <string>
#include <utility>
#include <vector>

#include "cli_testing.hpp"
#include "driver/device.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

namespace {

using namespace attnplan::cli_testing;

Result bench(const attnplan::testing::TempDir& scratch, std::vector<std::string> args) {
  return run_on_llama(scratch.path(), "bench", std::move(args));
}

}  // namespace

TEST_CASE("bench rejects bad input with exit 1 and names the option", "[cli][bench]") {
  attnplan::testing::TempDir scratch;
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--tokens", "9000"}, "--tokens 9000: more than the config's max_tokens 8192"},
      {{"--tokens", "0"}, "--tokens 0: expected an integer >= 1"},
      {{"--tokens", "12x"}, "--tokens 12x: expected an integer >= 1"},
      {{"--tokens", "4", "--seqs", "5"}, "--seqs 5: need 1 <= seqs <= tokens (4 tokens)"},
      {{"--block-size", "24"}, "/kv_cache/block_size: 24 is not a power of two"},
      {{"--mask", "sideways"}, "--mask sideways: expected causal or bidirectional"},
      {{"--mask", "bidirectional", "--prefix", "16"}, "--mask bidirectional: needs --prefix 0"},
      {{"--iterations", "0"}, "--iterations 0: expected an integer >= 1"},
      {{"--warmup-ms", "-5"}, "--warmup-ms -5: expected an integer >= 0"},
  };
  for (const Case& c : cases) {
    INFO(c.args.front() << " " << c.args.back());
    const Result result = bench(scratch, c.args);
    CHECK(result.exit_code == 1);
    CHECK(contains(result.err, c.message));
  }
  const Result unknown = bench(scratch, {"--frobnicate"});
  CHECK(unknown.exit_code == 1);
}

TEST_CASE("bench without a CUDA device says so and exits 1", "[cli][bench]") {
  if (attnplan::driver::device_available()) {
    SUCCEED("a device is present: the GPU machine runs the real benchmark (tools/bench_suite.sh)");
    return;
  }
  attnplan::testing::TempDir scratch;
  const Result result = bench(scratch, {"--tokens", "64"});
  CHECK(result.exit_code == 1);
  CHECK(contains(result.err, "no CUDA device"));
  CHECK(result.out.empty());
}

TEST_CASE("bench --help lists its options", "[cli][bench]") {
  attnplan::testing::TempDir scratch;
  const Result result = run_cli(scratch.path(), {"bench", "--help"});
  CHECK(result.exit_code == 0);
  for (const char* option : {"--tokens", "--seqs", "--prefix", "--block-size", "--iterations", "--warmup",
                             "--warmup-ms", "--json"})
    CHECK(contains(result.out, option));
}
