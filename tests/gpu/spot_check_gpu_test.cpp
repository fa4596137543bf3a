// check::spot_check on the device: it passes a correct plan (bf16 and fp8 caches, causal with a prefix and
// bidirectional spans) and fails when the reference's rules differ from what the kernel computed.
#include "check/spot_check.hpp"

#include "check/layer_check.hpp"
#include "gpu_support.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::gpu_testing;

namespace {

check::Scenario scenario(int tokens, int seqs, int prefix, bool bidirectional) {
  check::Scenario s;
  s.tokens = tokens;
  s.seqs = seqs;
  s.prefix = prefix;
  s.seed = 11;
  s.bidirectional = bidirectional;
  return s;
}

}  // namespace

TEST_CASE("the spot check passes a correct plan and compares the rows it names", "[gpu][check][spot]") {
  struct Case {
    const char* name;
    nlohmann::json patch;
    check::Scenario scenario;
  };
  const Case cases[] = {
      {"causal, prefix, window, softcap, sinks",
       {{"sliding_window", 70}, {"softcap", 30.0}, {"sinks", true}},
       scenario(300, 3, 40, false)},
      {"bidirectional spans, d128",
       {{"head_dim", 128}, {"bidirectional_spans", true}},
       scenario(260, 2, 0, true)},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const config::AttentionConfig config = config_from(c.patch);
    const check::LayerCase layer = check::random_case(config, c.scenario);
    const plan::PrefillPlan plan = gpu().load(config);
    DeviceCase device(plan, layer);
    const check::SpotCheck spot = check::spot_check(plan, layer, device.args, 16);
    INFO("relative L2 " << spot.relative_l2);
    CHECK(spot.rows == check::spot_rows(layer.batch, 16));
    CHECK(spot.rows.size() == 16);
    CHECK(spot.relative_l2 > 0);  // bf16 outputs: never exact
    CHECK(spot.passed());
    CHECK(spot.attention_unwritten == 0);
    CHECK(spot.output_unwritten == 0);
    CHECK(spot.output_non_finite == 0);
  }
}

TEST_CASE("the spot check fails attention that breaks the reference's rules", "[gpu][check][spot]") {
  // The plan runs without a softcap; the reference is told the config has one (a strong cap on O(1)
  // logits): the attention the GPU computed is then wrong by the check's rules.
  const config::AttentionConfig config = config_from({});
  check::LayerCase layer = check::random_case(config, scenario(200, 2, 30, false));
  const plan::PrefillPlan plan = gpu().load(config);
  DeviceCase device(plan, layer);
  layer.config.softcap = 0.5;
  const check::SpotCheck spot = check::spot_check(plan, layer, device.args, 16);
  INFO("relative L2 " << spot.relative_l2);
  CHECK(spot.relative_l2 > spot.tolerance);
  CHECK_FALSE(spot.passed());
  CHECK(spot.output_unwritten == 0);  // the run itself wrote everything
}
