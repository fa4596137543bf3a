// Host weights are checked against the config before upload_weights allocates anything, so a wrong dtype,
// shape or presence is Error(input) naming the tensor, with no GPU involved (these tests run without one).
#include "check/device_weights.hpp"

#include <string>

#include "check/layer_check.hpp"
#include "config/parse.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using namespace attnplan;

namespace {

config::AttentionConfig small_config() {
  return config::parse(nlohmann::json{{"schema", "attnplan/v1"},
                                      {"hidden_size", 256},
                                      {"query_heads", 4},
                                      {"kv_heads", 2},
                                      {"head_dim", 64},
                                      {"qkv_bias", true},
                                      {"output_bias", true},
                                      {"sinks", true}});
}

io::HostLayerWeights random_weights(const config::AttentionConfig& config) {
  check::Scenario scenario;
  scenario.tokens = 4;
  return check::random_case(config, scenario).weights;
}

// Both the check alone and upload_weights (which must fail before touching the driver) name the problem.
void rejected(const config::AttentionConfig& config, const io::HostLayerWeights& weights,
              const std::string& message) {
  const Error checked = expect_error([&] { check::validate_host_weights(config, weights); });
  CHECK(checked.stage() == Stage::input);
  CHECK(checked.message() == message);
  const Error uploaded = expect_error([&] { check::upload_weights(config, weights); });
  CHECK(uploaded.stage() == Stage::input);
  CHECK(uploaded.message() == message);
}

}  // namespace

TEST_CASE("weights of the wrong dtype, shape or presence are refused before any upload",
          "[check][weights][reliability]") {
  const config::AttentionConfig config = small_config();
  const io::HostLayerWeights good = random_weights(config);
  CHECK_NOTHROW(check::validate_host_weights(config, good));

  {
    io::HostLayerWeights w = good;
    w.k_proj.dtype = io::Dtype::f16;  // same bytes, another dtype: a projection must be bf16
    rejected(config, w, "weights.k_proj: dtype F16, expected BF16 (projection weights)");
  }
  {
    io::HostLayerWeights w = good;
    w.v_bias->dtype = io::Dtype::i32;
    w.v_bias->bytes.resize(w.v_bias->bytes.size() * 2);
    rejected(config, w, "weights.v_bias: dtype I32, expected BF16, F16 or F32");
  }
  {
    io::HostLayerWeights w = good;
    w.o_proj.shape = {256, 128};
    w.o_proj.bytes.resize(256 * 128 * 2);
    rejected(config, w, "weights.o_proj: shape [256, 128], expected [256, 256]");
  }
  {
    io::HostLayerWeights w = good;
    w.input_norm.bytes.pop_back();
    rejected(config, w, "weights.input_norm: 511 bytes, but shape [256] of BF16 needs 512");
  }
  {
    io::HostLayerWeights w = good;
    w.q_norm = w.input_norm;
    w.q_norm->shape = {64};
    w.q_norm->bytes.resize(128);
    rejected(config, w, "weights.q_norm: given, but qkv_norm.query is false");
  }
  {
    io::HostLayerWeights w = good;
    w.o_bias.reset();
    rejected(config, w, "weights.o_bias: missing, and output_bias is true");
  }
  {
    io::HostLayerWeights w = good;
    w.sinks->dtype = io::Dtype::f64;
    w.sinks->bytes.resize(w.sinks->bytes.size() * 2);
    rejected(config, w, "weights.sinks: dtype F64, expected BF16, F16 or F32");
  }
}
