// The fp8-activation projection's specs (plan/gemm_fp8.hpp): NVRTC compiles of the quantizer and of the
// e4m3 GEMMs for every weight scale granularity (wgmma on sm_90a: no spills, the registers setmaxnreg
// needs; sm_80: the trap body compiles; mma.sync for sm_89 and sm_90a: no spills), launch shapes,
// workspace buffers and the checks' messages.
#include <string>

#include "../compiler/test_kernels.hpp"
#include "compiler/compiler.hpp"
#include "config/parse.hpp"
#include "core/error.hpp"
#include "plan/gemm_fp8.hpp"
#include "plan/gemm_spec.hpp"
#include "plan_testing.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using namespace attnplan;

TEST_CASE("fp8-activation kernels compile for sm_80 and sm_90a", "[plan][gemm][gemm_fp8][nvrtc]") {
  const auto arch = GENERATE(testing::kSm80, testing::kSm90a);
  for (const auto scales : {config::Fp8ActivationScales::token_group, config::Fp8ActivationScales::token}) {
    const auto quantize = testing::test_compiler().compile(plan::Fp8QuantizeSpec{scales}.source(),
                                                           compiler::CompileOptions{arch});
    INFO(quantize.log);
    CHECK(quantize.resources.spill_bytes() == 0);
    UNSCOPED_INFO(arch.name() << " fp8 quantize per " << config::to_string(scales) << ": "
                              << quantize.resources.registers << " registers");
  }
  for (auto granularity : {config::Fp8ScaleGranularity::tensor, config::Fp8ScaleGranularity::channel,
                           config::Fp8ScaleGranularity::block}) {
    plan::GemmFp8Spec spec;
    spec.segments = 3;
    spec.has_bias = true;
    spec.granularity = granularity;
    const auto source = spec.source();
    INFO(source.render_stub());
    const auto kernel = testing::test_compiler().compile(source, compiler::CompileOptions{arch});
    INFO(kernel.log);
    CHECK(kernel.resources.spill_bytes() == 0);
    // Two partials in flight: a loop whose second half-pair sat under a branch had ptxas serialize them.
    plan_testing::check_wgmma_asynchronous(kernel);
    // 384 threads x 168 = 64512: the kernel-wide budget setmaxnreg redistributes (40 / 232).
    CHECK(kernel.resources.registers <= 168);
    UNSCOPED_INFO(arch.name() << " " << source.render_stub() << ": " << kernel.resources.registers
                              << " registers, " << spec.dynamic_shared_bytes() << " B shared");
  }
}

// The sm_89 kernel (mma.sync m16n8k32 e4m3) for sm_89 and for sm_90a, where the GPU tests force it.
TEST_CASE("the mma.sync fp8-activation GEMM compiles for sm_89 and sm_90a with no spills",
          "[plan][gemm][gemm_fp8][nvrtc]") {
  const auto arch = GENERATE(config::Arch{8, 9, false}, testing::kSm90a);
  for (auto granularity : {config::Fp8ScaleGranularity::tensor, config::Fp8ScaleGranularity::channel,
                           config::Fp8ScaleGranularity::block}) {
    plan::GemmFp8Spec spec = plan::choose_fp8_gemm(config::Arch{8, 9, false});
    REQUIRE(spec.kernel == plan::GemmFp8Kernel::mma_sync);
    spec.segments = 3;
    spec.has_bias = true;
    spec.granularity = granularity;
    const auto source = spec.source();
    INFO(source.render_stub());
    CHECK(source.header == "attnplan/gemm_sm89_fp8.cuh");
    const auto kernel = testing::test_compiler().compile(source, compiler::CompileOptions{arch});
    INFO(kernel.log);
    CHECK(kernel.resources.spill_bytes() == 0);
    CHECK(kernel.resources.stack_bytes == 0);
    CHECK(kernel.resources.registers <= 255);
    UNSCOPED_INFO(arch.name() << " " << source.render_stub() << ": " << kernel.resources.registers
                              << " registers, " << spec.dynamic_shared_bytes() << " B shared");
  }
}

TEST_CASE("fp8-activation GEMM: shapes, buffers and checks", "[plan][gemm][gemm_fp8]") {
  plan::GemmFp8Spec spec;
  CHECK(spec.dynamic_shared_bytes() == 6 * 2 * 128 * 128 + 4 * 64 * 64 * 2 + 6 * 16 + 1024);
  const driver::LaunchShape shape = spec.launch_shape(300, 6144, 132);
  CHECK(shape.grid.x == 132);
  CHECK(spec.launch_shape(37, 200, 132).grid.x == 2);
  // 37 tokens x 23 groups of 128 channels, 16 (token, group) items per CTA (a half-warp each).
  CHECK(plan::Fp8QuantizeSpec{}.launch_shape(37, 2880).grid.x == (37 * 23 + 15) / 16);
  // One CTA per token where the scales are per token.
  const driver::LaunchShape tokens =
      plan::Fp8QuantizeSpec{config::Fp8ActivationScales::token}.launch_shape(37, 2880);
  CHECK(tokens.grid.x == 37);
  CHECK(tokens.block.x == kFp8TokenQuantizeThreads);

  CHECK(plan::fp8_activation_bytes(37, 2880) ==
        (37 * 2880 + 255) / 256 * 256 + 23 * 40 * 4 / 256 * 256 + 256);
  alignas(256) static unsigned char storage[1];
  const plan::Fp8ActivationBuffers buffers = plan::fp8_activation_buffers(storage, 37, 2880);
  CHECK(buffers.scale_ld == 40);
  CHECK(reinterpret_cast<unsigned char*>(buffers.scales) - storage == (37 * 2880 + 255) / 256 * 256);

  CHECK(plan::fp8_activation_gemm_available(testing::kSm90a));
  CHECK(plan::fp8_activation_gemm_available(config::Arch{8, 9, false}));
  CHECK_FALSE(plan::fp8_activation_gemm_available(testing::kSm80));

  // The mma_sync kernel: not persistent, 256 threads, 4 stages of 20 KiB.
  plan::GemmFp8Spec sm89 = plan::choose_fp8_gemm(config::Arch{8, 9, false});
  CHECK(sm89.kernel == plan::GemmFp8Kernel::mma_sync);
  CHECK(sm89.dynamic_shared_bytes() == 4 * (128 + 128) * 80);
  CHECK(sm89.launch_shape(300, 6144, 132).grid.x == 3 * 48);
  CHECK(sm89.launch_shape(300, 6144, 132).block.x == 256);
  CHECK(plan::choose_fp8_gemm(testing::kSm90a).kernel == plan::GemmFp8Kernel::wgmma);

  alignas(16) static unsigned char memory[64];
  GemmParams params{};
  params.a = reinterpret_cast<const bf16_bits*>(memory);
  params.c = reinterpret_cast<bf16_bits*>(memory);
  params.m = 5;
  params.n = 200;
  params.k = 2888;
  params.lda = 2888;
  params.ldc = 200;
  params.segments[0] = {reinterpret_cast<const bf16_bits*>(memory), nullptr, 0, 200, memory, nullptr};
  CHECK(contains(expect_error([&] { spec.check(params); }).message(),
                 "K = 2888 must be a positive multiple of 16"));
  params.k = params.lda = 2880;
  spec.check(params);
  params.segments[0].scales = nullptr;
  CHECK(contains(expect_error([&] { spec.check(params); }).message(), "segments[0].scales"));
  spec.segments = 2;
  params.segments[0] = {reinterpret_cast<const bf16_bits*>(memory), nullptr, 0, 100, memory, nullptr};
  params.segments[1] = {reinterpret_cast<const bf16_bits*>(memory), nullptr, 100, 200, memory, nullptr};
  CHECK(contains(expect_error([&] { spec.check(params); }).message(), "segments[0] is 100 wide"));

  // The activation buffers: scale_ld >= M, and scales the sm_90a GEMM's 32-bit offsets reach (K 2880: 23
  // groups of 128 channels, so scale_ld 2^26 fits and 2^27 does not).
  plan::Fp8ActivationBuffers activations = plan::fp8_activation_buffers(memory, params.m, params.k);
  plan::check_fp8_activation_buffers(params, activations);
  activations.scale_ld = 1ll << 26;
  plan::check_fp8_activation_buffers(params, activations);
  activations.scale_ld = 1ll << 27;
  CHECK(contains(expect_error([&] { plan::check_fp8_activation_buffers(params, activations); }).message(),
                 "32-bit scale offsets"));
  activations.scale_ld = params.m - 1;
  CHECK(contains(expect_error([&] { plan::check_fp8_activation_buffers(params, activations); }).message(),
                 "scale_ld < M"));
}

namespace {

// Llama-3.1-8B's postprocess (RoPE, rotate_half, D 128) and Qwen3-8B's (RoPE and q/k norms).
plan::QkvPostprocessSpec fused_postprocess(bool norms) {
  config::AttentionConfig config =
      config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/llama-3.1-8b.json");
  config.qkv_norm.query = norms;
  config.qkv_norm.key = norms;
  return plan::QkvPostprocessSpec::from_config(config);
}

}  // namespace

TEST_CASE("the q|k|v postprocess in the sm_90a fp8 GEMM's epilogue compiles with no spills",
          "[plan][gemm][gemm_fp8][nvrtc]") {
  for (const bool norms : {false, true}) {
    for (auto granularity : {config::Fp8ScaleGranularity::channel, config::Fp8ScaleGranularity::block}) {
      plan::GemmFp8Spec spec;
      spec.segments = 3;
      spec.has_bias = !norms;
      spec.granularity = granularity;
      spec.postprocess = fused_postprocess(norms);
      REQUIRE(spec.postprocess->fits_gemm_epilogue(kGemmSm90Fp8BlockN));
      const auto source = spec.source();
      INFO(source.render_stub());
      CHECK(contains(source.render_stub(), "/*qkv_epilogue=*/attnplan::kernels::QkvEpilogueTraits"));
      CHECK(source.spec.contains("qkv_epilogue"));
      const auto kernel = testing::test_compiler().compile(source, compiler::CompileOptions{testing::kSm90a});
      INFO(kernel.log);
      CHECK(kernel.resources.spill_bytes() == 0);
      CHECK(kernel.resources.registers <= 168);
      plan_testing::check_wgmma_asynchronous(kernel);
    }
  }
}

TEST_CASE("the fp8 GEMM's fused postprocess: the kernel it needs and the values it reads",
          "[plan][gemm][gemm_fp8]") {
  plan::GemmFp8Spec spec = plan::choose_fp8_gemm(config::Arch{8, 9, false});
  spec.postprocess = fused_postprocess(true);
  const Error mma_sync = expect_error([&] { (void)spec.source(); });
  CHECK(mma_sync.stage() == Stage::input);
  CHECK(contains(mma_sync.what(), "needs the wgmma kernel"));

  const plan::QkvPostprocessSpec post = fused_postprocess(true);
  const auto message = [&](const GemmQkvEpilogueParams* values) {
    return std::string(expect_error([&] { (void)plan::checked_qkv_epilogue(post, values); }).what());
  };
  CHECK(contains(message(nullptr), "gemm qkv_epilogue: the spec fuses the q|k|v postprocess"));
  static const float table[1] = {};
  static const bf16_bits weight[1] = {};
  GemmQkvEpilogueParams values{};
  CHECK(contains(message(&values), "qkv_epilogue.rotations: null"));
  values.rotations = table;
  values.rotation_stride = rope_rotation_stride(post.rotary_dim) + 1;
  CHECK(contains(message(&values), "qkv_epilogue.rotation_stride"));
  values.rotation_stride = rope_rotation_stride(post.rotary_dim);
  CHECK(contains(message(&values), "qkv_epilogue.q_norm_weight: null"));
  values.q_norm_weight = weight;
  CHECK(contains(message(&values), "qkv_epilogue.k_norm_weight: null"));
  values.k_norm_weight = weight;
  values.epsilon = 1e-6f;
  const GemmQkvEpilogueParams checked = plan::checked_qkv_epilogue(post, &values);
  CHECK(checked.rotations == table);
  CHECK(checked.epsilon == 1e-6f);

  // The params check it before any tensor map is encoded.
  plan::GemmFp8Spec wgmma;
  wgmma.postprocess = post;
  const plan::Fp8ActivationBuffers buffers{};
  CHECK(contains(
      expect_error([&] { (void)plan::make_gemm_sm90_fp8_params(wgmma, GemmParams{}, buffers); }).what(),
      "gemm qkv_epilogue"));
}
