// attnplan verify's command line: bad input exits 1 naming the option or the scenario's rule, found before
// any device work (these cases run without a GPU, where the first device step would fail with exit 2).
#include <string>
#include <utility>
#include <vector>

#include "cli_testing.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

namespace {

using namespace attnplan::cli_testing;

Result verify(const attnplan::testing::TempDir& scratch, std::vector<std::string> args) {
  return run_on_llama(scratch.path(), "verify", std::move(args));
}

}  // namespace

TEST_CASE("verify rejects bad input with exit 1 before any device work", "[cli][verify]") {
  attnplan::testing::TempDir scratch;
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--tokens", "0"}, "--tokens 0: expected an integer >= 1"},
      {{"--tokens", "9000"}, "--tokens 9000: more than the config's max_tokens 8192"},
      {{"--tokens", "4", "--seqs", "5"}, "scenario: 4 tokens over 5 sequences"},
      {{"--tolerance", "-1"}, "--tolerance -1: expected a number greater than 0"},
      {{"--tolerance", "0"}, "--tolerance 0: expected a number greater than 0"},
      {{"--tolerance", "1e-2x"}, "--tolerance 1e-2x: expected a number greater than 0"},
      {{"--tolerance", "nan"}, "--tolerance nan: expected a number greater than 0"},
      // Was std::bad_alloc (exit 2) while the host built a KV pool for 10^8 positions.
      {{"--prefix", "99999999"},
       "scenario: sequence 0 would hold 100000255 positions (prefix 99999999 + chunk 256), more than the "
       "1048576"},
      {{"--weights", "/nonexistent/w.safetensors"}, "cannot open /nonexistent/w.safetensors"},
      {{"--mask", "sideways"}, "--mask sideways: expected causal or bidirectional"},
  };
  for (const Case& c : cases) {
    INFO(c.args.front() << " " << c.args.back() << ": " << c.message);
    const Result result = verify(scratch, c.args);
    INFO(result.err);
    CHECK(result.exit_code == 1);
    CHECK(contains(result.err, "input error: " + c.message));
  }
  const Result layer_alone = verify(scratch, {"--layer", "model.layers.0."});
  CHECK(layer_alone.exit_code == 1);
  CHECK(contains(layer_alone.err, "--layer needs --weights"));
}
