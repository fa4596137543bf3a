// Host weights are checked against the config before upload_weights allocates anything, so a wrong dtype,
// shape or presence is Error(input) naming the tensor, with no GPU involved (these tests run without one).
#include "check/device_weights.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "check/layer_check.hpp"
#include "check_testing.hpp"
#include "config/parse.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using namespace attnplan;
using check_testing::small_config;

namespace {

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

TEST_CASE("quantized projections are checked against their format's tensors", "[check][weights][quantized]") {
  config::AttentionConfig config = small_config();
  config.projection.qkv.format = config::WeightFormat::packed_integer;
  config.projection.qkv.group_size = 64;
  config.projection.output.format = config::WeightFormat::affine;
  config.projection.output.bits = 3;
  config.projection.output.group_size = 32;
  const io::HostLayerWeights good = random_weights(config);
  CHECK_NOTHROW(check::validate_host_weights(config, good));
  {
    io::HostLayerWeights w = good;
    w.k_quant.zeros.reset();
    rejected(config, w, "weights.k_proj (k_proj.qzeros): missing (packed_integer weights)");
  }
  {
    io::HostLayerWeights w = good;
    w.o_quant.zeros->shape = {256, 4};
    rejected(config, w,
             "weights.o_proj (o_proj.biases): shape [256, 4], expected [N, K / group_size] = [256, 8]");
  }
  {
    // A plain g_idx (k / group_size) without act_order is accepted; a permuted one needs act_order.
    io::HostLayerWeights w = good;
    io::HostTensor g_idx{io::Dtype::i32, {256}, std::vector<std::uint8_t>(256 * 4)};
    for (std::int32_t k = 0; k < 256; ++k) {
      const std::int32_t group = k / 64;
      std::memcpy(g_idx.bytes.data() + 4 * k, &group, 4);
    }
    w.q_quant.g_idx = g_idx;
    CHECK_NOTHROW(check::validate_host_weights(config, w));
    std::swap(g_idx.bytes[0], g_idx.bytes[4 * 100]);  // g_idx[0] = 1, g_idx[100] = 0
    w.q_quant.g_idx = g_idx;
    rejected(
        config, w,
        "weights.q_proj: g_idx[0] = 1 is not k / group_size = 0; set /projection/act_order to true for a "
        "permuted g_idx");
    // With act_order a permuted g_idx is what is expected; a group outside [0, K / group_size) is not.
    config::AttentionConfig act_order = config;
    act_order.projection.qkv.act_order = true;
    io::HostLayerWeights ordered = random_weights(act_order);
    CHECK_NOTHROW(check::validate_host_weights(act_order, ordered));
    for (const std::int32_t outside : {4, -1}) {  // K 256 in groups of 64: groups 0..3
      std::memcpy(ordered.q_quant.g_idx->bytes.data() + 4 * 7, &outside, 4);
      rejected(act_order, ordered,
               fmt::format(
                   "weights.q_proj: g_idx[7] = {} is outside [0, 4), the groups of K = 256 in groups of 64",
                   outside));
    }
  }
}
