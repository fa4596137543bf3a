// NVRTC compiles of every quantized weight policy of the projection GEMM (gemm.cuh), for sm_80 and
// sm_90a, over the heuristic's three tilings: no spills, and the shared memory the spec promises.
#include <string>

#include "../compiler/test_kernels.hpp"
#include "compiler/compiler.hpp"
#include "core/error.hpp"
#include "plan/gemm_spec.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/weight_encodings.hpp"

using namespace attnplan;

namespace {

config::WeightEncoding encoding(config::WeightFormat format, config::Fp8ScaleGranularity granularity =
                                                                 config::Fp8ScaleGranularity::tensor) {
  config::WeightEncoding result;
  result.format = format;
  result.scale_granularity = granularity;
  return result;
}

using testing::affine_encoding;
using testing::packed_encoding;

const config::WeightEncoding kSupported[] = {
    encoding(config::WeightFormat::fp8, config::Fp8ScaleGranularity::tensor),
    encoding(config::WeightFormat::fp8, config::Fp8ScaleGranularity::channel),
    encoding(config::WeightFormat::fp8, config::Fp8ScaleGranularity::block),
    encoding(config::WeightFormat::mxfp8),
    encoding(config::WeightFormat::mxfp4),
    encoding(config::WeightFormat::nvfp4),
    packed_encoding(config::PackedIntegerScheme::gptq, 4, 128, false),
    packed_encoding(config::PackedIntegerScheme::gptq, 4, 128, true),
    packed_encoding(config::PackedIntegerScheme::gptq_v2, 8, -1, false),
    packed_encoding(config::PackedIntegerScheme::gptq, 8, 32, true),
    packed_encoding(config::PackedIntegerScheme::awq, 4, 128, false),
    packed_encoding(config::PackedIntegerScheme::awq, 4, -1, false),
    affine_encoding(2, 64),
    affine_encoding(3, 64),
    affine_encoding(4, 32),
    affine_encoding(5, 128),
    affine_encoding(6, 64),
    affine_encoding(8, 128),
};

const plan::GemmTiling kTilings[] = {
    {.block_m = 128, .block_n = 128, .block_k = 32, .warps_m = 2, .warps_n = 4, .stages = 4},
    {.block_m = 64, .block_n = 128, .block_k = 64, .warps_m = 2, .warps_n = 2, .stages = 3},
    {.block_m = 64, .block_n = 64, .block_k = 64, .warps_m = 2, .warps_n = 2, .stages = 4},
};

}  // namespace

TEST_CASE("quantized GEMM policies compile for sm_80 and sm_90a", "[plan][gemm][quantized][nvrtc]") {
  const auto arch = GENERATE(testing::kSm80, testing::kSm90a);
  for (const auto& weights : kSupported) {
    for (const auto& tiling : kTilings) {
      plan::GemmSpec spec;
      spec.segments = 3;
      spec.has_bias = true;
      spec.tiling = tiling;
      spec.weights = weights;
      const auto source = spec.source();
      INFO(source.render_stub());
      const auto kernel = testing::test_compiler().compile(source, compiler::CompileOptions{arch});
      INFO(kernel.log);
      CHECK(kernel.resources.spill_bytes() == 0);
      CHECK(kernel.resources.registers <= 255);
      UNSCOPED_INFO(arch.name() << " " << source.render_stub() << ": " << kernel.resources.registers
                                << " registers, " << spec.dynamic_shared_bytes() << " B shared");
    }
  }
}

TEST_CASE("formats without a GEMM policy are refused by name", "[plan][gemm][quantized]") {
  plan::GemmSpec spec;
  spec.weights =
      packed_encoding(config::PackedIntegerScheme::gptq, 4, 36, false);  // 8 k would straddle groups
  CHECK(contains(expect_error([&] { (void)spec.source(); }).message(),
                 "no weight loader for format packed_integer"));
  spec.weights = encoding(config::WeightFormat::fp8);
  spec.weights.activation = config::ActivationType::fp8;
  CHECK(contains(expect_error([&] { (void)spec.source(); }).message(), "fp8 with fp8 activations"));
  CHECK(plan::gemm_supports(encoding(config::WeightFormat::packed_integer)));
  CHECK(plan::gemm_supports(affine_encoding(3, 64)));
  CHECK_FALSE(plan::gemm_supports(affine_encoding(7, 64)));
  CHECK_FALSE(plan::gemm_supports(packed_encoding(config::PackedIntegerScheme::awq, 8, 128, false)));
}

TEST_CASE("bf16 keeps its instantiation; quantized shared memory counts packed stages",
          "[plan][gemm][quantized]") {
  plan::GemmSpec spec;
  CHECK(spec.source().render_stub().find("weights") == std::string::npos);
  CHECK(spec.dynamic_shared_bytes() == 4 * (128 + 128) * 32 * 2);
  spec.weights = encoding(config::WeightFormat::mxfp4);
  // 4 stages of A [128, 32] bf16 + W [128, 32] at 4 bits, plus the bf16 [128, 32] dequantized tile.
  CHECK(spec.dynamic_shared_bytes() == 4 * (128 * 32 * 2 + 128 * 32 / 2) + 128 * 32 * 2);
}
