// check::random_case, the scenario behind attnplan verify and bench: what it refuses before it builds
// anything (no GPU involved).
#include "check/layer_check.hpp"

#include "check_testing.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using namespace attnplan;
using check_testing::small_config;

TEST_CASE("random_case: a sequence past kMaxScenarioPositions is refused before its pool is built",
          "[check][scenario]") {
  const config::AttentionConfig config = small_config();
  check::Scenario scenario;
  scenario.tokens = 8;
  scenario.seqs = 2;
  scenario.chunk_lens = {4, 4};
  scenario.context_lens = {16, static_cast<int>(check::kMaxScenarioPositions) - 3};
  const Error error = expect_error([&] { check::random_case(config, scenario); });
  CHECK(error.stage() == Stage::input);
  CHECK(error.message() ==
        "scenario: sequence 1 would hold 1048577 positions (prefix 1048573 + chunk 4), more than the 1048576 "
        "a scenario's KV pool and reference are built for");

  // Short prefixes: the batch as given.
  scenario.context_lens = {16, 32};
  const check::LayerCase built = check::random_case(config, scenario);
  CHECK(built.batch.context_lens == std::vector<int>{16, 32});
  CHECK(built.batch.query_starts == std::vector<int>{0, 4, 8});
}
