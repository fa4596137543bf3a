#include "plan/kernel_plan.hpp"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "config/parse.hpp"
#include "core/error.hpp"
#include "plan/prefill_plan.hpp"
#include "support/catch.hpp"

using namespace attnplan;

namespace {
config::AttentionConfig llama() {
  return config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/llama-3.1-8b.json");
}
}  // namespace

TEST_CASE("the plan runs the layer's stages in spec order", "[plan]") {
  const plan::KernelPlan kernels = plan::plan_kernels(llama(), config::kDefaultArch);
  std::vector<std::string> names;
  for (const auto& kernel : kernels.kernels) names.push_back(kernel.name);
  // On sm_90a each projection also gets its kSmallLaunchTokens specialization (192- and 128-wide tiles;
  // see below).
  CHECK(names == std::vector<std::string>{"input_rmsnorm", "qkv_projection", "qkv_projection_small",
                                          "qkv_postprocess", "kv_store", "attention", "output_projection",
                                          "output_projection_small"});
  CHECK(kernels.qkv_projection.segments == 3);  // separate q/k/v weights write one fused row
  CHECK(kernels.output_projection.segments == 1);
  CHECK(plan::qkv_row_width(llama()) == 32 * 128 + 8 * 128 * 2);
}

TEST_CASE("on sm_90a both projections run the wgmma kernel; elsewhere mma.sync", "[plan][gemm]") {
  const plan::KernelPlan hopper = plan::plan_kernels(llama(), config::Arch{9, 0, true});
  CHECK(hopper.qkv_projection.kernel == plan::GemmKernel::wgmma);
  CHECK(hopper.output_projection.kernel == plan::GemmKernel::wgmma);
  CHECK(hopper.kernels[1].source.header == "attnplan/gemm_sm90.cuh");
  CHECK(hopper.kernels[1].dynamic_shared_bytes == hopper.qkv_projection.dynamic_shared_bytes());
  for (const config::Arch arch : {config::Arch{8, 0, false}, config::Arch{9, 0, false}}) {
    const plan::KernelPlan other = plan::plan_kernels(llama(), arch);
    CHECK(other.qkv_projection.kernel == plan::GemmKernel::mma_sync);
    CHECK(other.output_projection.kernel == plan::GemmKernel::mma_sync);
    CHECK(other.kernels[1].source.header == "attnplan/gemm.cuh");
  }
}

TEST_CASE(
    "on sm_90a the weight-only plans run the decoding kernel (4-bit codes in rows of bytes, AWQ's words) or "
    "wgmma_w4; "
    "GPTQ with act order and other archs mma.sync",
    "[plan][gemm][gemm_w4][gemm_decode]") {
  const config::Arch hopper{9, 0, true};
  const auto load = [](const char* name) {
    return config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/" + name + ".json");
  };
  // Short launches of mxfp4, nvfp4 and MLX 4-bit: the decoding kernel, tiled for kDecodeTiledTokens (511:
  // clusters of 2); the dequantized path takes the launches past its one wave.
  for (const char* name :
       {"llama-3.1-8b-nvfp4", "llama-3.1-8b-mlx-4bit", "gpt-oss-20b-mxfp4", "llama-3.1-8b-awq"}) {
    INFO(name);
    const config::AttentionConfig config = load(name);
    const plan::KernelPlan kernels = plan::plan_kernels(config, hopper);
    CHECK(plan::sm90_decode_gemm_planned(config.projection.qkv));
    CHECK(kernels.qkv_projection.kernel == plan::GemmKernel::wgmma_decode);
    CHECK(kernels.output_projection.kernel == plan::GemmKernel::wgmma_decode);
    CHECK(kernels.kernels[1].source.header == "attnplan/gemm_sm90_decode.cuh");
    CHECK(kernels.qkv_projection.sm90.cluster_m == 2);
    CHECK(kernels.qkv_projection.sm90 ==
          plan::gemm_sm90_decode_tiling(kernels.qkv_projection.sm90.block_n, 4, 2));
    REQUIRE(config.max_tokens >= 1024);
    REQUIRE(kernels.qkv_projection_dequantized.has_value());
    REQUIRE(kernels.output_projection_dequantized.has_value());
    CHECK(kernels.qkv_projection_dequantized->min_tokens ==
          plan::decode_dequantized_min_tokens(kernels.qkv_projection.sm90, int(plan::qkv_row_width(config)),
                                              132));
    CHECK(plan::plan_kernels(config, config::Arch{8, 0, false}).qkv_projection.kernel ==
          plan::GemmKernel::mma_sync);
  }
  // Llama-3.1-8B nvfp4 below 512 tokens: q|k|v 192 wide, o 128 (the speed test's 512-token picks), and
  // specializations for short launches (kDecodeSmallLaunchTokens: two row tiles), q|k|v 128 wide in
  // clusters of 2 and o 64 wide (128 CTAs each), which launches of 256 tokens or fewer take; 512 (128
  // tiles: one wave) take the planned one, 513 the dequantized path.
  const plan::KernelPlan nvfp4 = plan::plan_kernels(load("llama-3.1-8b-nvfp4"), hopper);
  CHECK(nvfp4.qkv_projection.sm90.block_n == 192);
  CHECK(nvfp4.output_projection.sm90.block_n == 128);
  REQUIRE(nvfp4.qkv_projection_small);
  CHECK(nvfp4.qkv_projection_small->kernel == plan::GemmKernel::wgmma_decode);
  CHECK(nvfp4.qkv_projection_small->sm90 == plan::gemm_sm90_decode_tiling(128, 4, 2));
  REQUIRE(nvfp4.output_projection_small);
  CHECK(nvfp4.output_projection_small->sm90 == plan::gemm_sm90_decode_tiling(64, 4));
  CHECK(plan::launched_projection_variant(nvfp4, plan::StageKind::output_projection, 256, 4096, 132) ==
        plan::ProjectionVariant::small);
  CHECK(plan::launched_projection_variant(nvfp4, plan::StageKind::output_projection, 384, 4096, 132) ==
        plan::ProjectionVariant::planned);
  const auto variant = [&](int tokens) {
    return plan::launched_projection_variant(nvfp4, plan::StageKind::qkv_projection, tokens, 6144, 132);
  };
  // One row tile: q|k|v's tiny specialization, 64 wide unclustered (96 CTAs, where 128 x2 holds 48 tiles);
  // o has none (its small one is already that tiling).
  REQUIRE(nvfp4.qkv_projection_tiny);
  CHECK(nvfp4.qkv_projection_tiny->sm90 == plan::gemm_sm90_decode_tiling(64, 4));
  CHECK_FALSE(nvfp4.output_projection_tiny);
  CHECK(variant(1) == plan::ProjectionVariant::tiny);
  CHECK(variant(128) == plan::ProjectionVariant::tiny);
  CHECK(variant(129) == plan::ProjectionVariant::small);
  CHECK(variant(256) == plan::ProjectionVariant::small);
  CHECK(plan::launched_projection_variant(nvfp4, plan::StageKind::output_projection, 64, 4096, 132) ==
        plan::ProjectionVariant::small);
  // The kernels in launch order: each specialization right after its planned kernel, the tiny one last,
  // then the dequantized path's two and its GEMM's short-launch tiling.
  std::vector<std::string> names;
  for (const auto& kernel : nvfp4.kernels) names.push_back(kernel.name);
  CHECK(names == std::vector<std::string>{
                     "input_rmsnorm", "qkv_projection", "qkv_projection_small", "qkv_projection_tiny",
                     "qkv_dequantize", "qkv_projection_dequantized", "qkv_projection_dequantized_small",
                     "qkv_postprocess", "kv_store", "attention", "output_projection",
                     "output_projection_small", "output_dequantize", "output_projection_dequantized",
                     "output_projection_dequantized_small"});
  for (const plan::PlannedKernel& kernel : nvfp4.kernels) {
    if (kernel.name == plan::kQkvProjectionTinyName) {
      CHECK(plan::projection_variant_of(kernel) == plan::ProjectionVariant::tiny);
      CHECK(kernel.stage == plan::StageKind::qkv_projection);
      CHECK(kernel.dynamic_shared_bytes == nvfp4.qkv_projection_tiny->dynamic_shared_bytes());
    }
  }
  // gpt-oss-20b: q|k|v (N 5120) gets one too, o (N 2880) not; a plan of at most 128 tokens none.
  const config::AttentionConfig gpt_oss = load("gpt-oss-20b-mxfp4");
  const plan::KernelPlan gpt_oss_kernels = plan::plan_kernels(gpt_oss, hopper);
  REQUIRE(gpt_oss_kernels.qkv_projection_tiny);
  CHECK(gpt_oss_kernels.qkv_projection_tiny->sm90 == plan::gemm_sm90_decode_tiling(64, 4));
  CHECK_FALSE(gpt_oss_kernels.output_projection_tiny);
  config::AttentionConfig short_gpt_oss = gpt_oss;
  short_gpt_oss.max_tokens = plan::kDecodeTinyLaunchTokens;
  CHECK_FALSE(plan::plan_kernels(short_gpt_oss, hopper).qkv_projection_tiny);
  CHECK(variant(511) == plan::ProjectionVariant::planned);
  CHECK(variant(512) == plan::ProjectionVariant::planned);
  CHECK(variant(513) == plan::ProjectionVariant::dequantized);
  CHECK(plan::launched_projection_variant(nvfp4, plan::StageKind::output_projection, 512, 4096, 132) ==
        plan::ProjectionVariant::planned);
  CHECK(plan::launched_projection_variant(nvfp4, plan::StageKind::output_projection, 513, 4096, 132) ==
        plan::ProjectionVariant::dequantized);
  // AWQ's shares are whole 32-row code boxes of words: never 160 wide (pairs of 80 rows).
  const plan::KernelPlan awq = plan::plan_kernels(load("llama-3.1-8b-awq"), hopper);
  CHECK(plan::sm90_decode_awq_share_fits(awq.qkv_projection.sm90.block_n, awq.qkv_projection.sm90.cluster_m));
  // GPTQ's words without act order too (with it, each k's group is g_idx[k]: mma.sync and the dequantized
  // path), and past one wave of tiles the dequantized path.
  config::AttentionConfig gptq = load("llama-3.1-8b-gptq");
  CHECK_FALSE(plan::sm90_decode_gemm_planned(gptq.projection.qkv));
  gptq.projection.qkv.act_order = gptq.projection.output.act_order = false;
  CHECK(plan::sm90_decode_gemm_planned(gptq.projection.qkv));
  const plan::KernelPlan gptq_kernels = plan::plan_kernels(gptq, hopper);
  CHECK(gptq_kernels.qkv_projection.kernel == plan::GemmKernel::wgmma_decode);
  CHECK(gptq_kernels.output_projection.kernel == plan::GemmKernel::wgmma_decode);
  REQUIRE(gptq_kernels.qkv_projection_dequantized);
  CHECK(gptq_kernels.qkv_projection_dequantized->min_tokens == 513);
  // The 8-bit formats: wgmma_w4.
  for (const char* name : {"llama-3.1-8b-fp8", "qwen3-8b-fp8-block", "llama-3.1-8b-mxfp8"}) {
    INFO(name);
    const config::AttentionConfig config = load(name);
    CHECK_FALSE(plan::sm90_decode_gemm_planned(config.projection.qkv));
    const plan::KernelPlan kernels = plan::plan_kernels(config, hopper);
    // sm90_w4_gemm_enabled switches the kernel off in one place; the plan then keeps mma.sync.
    const bool w4 = plan::sm90_w4_gemm_enabled();
    CHECK(kernels.qkv_projection.kernel == (w4 ? plan::GemmKernel::wgmma_w4 : plan::GemmKernel::mma_sync));
    CHECK(kernels.output_projection.kernel == kernels.qkv_projection.kernel);
    CHECK(kernels.kernels[1].source.header == (w4 ? "attnplan/gemm_sm90_w4.cuh" : "attnplan/gemm.cuh"));
    CHECK(plan::plan_kernels(config, config::Arch{8, 0, false}).qkv_projection.kernel ==
          plan::GemmKernel::mma_sync);
  }
  CHECK(plan::plan_kernels(load("llama-3.1-8b-gptq"), hopper).qkv_projection.kernel ==
        plan::GemmKernel::mma_sync);
}

TEST_CASE("sm_90a plans a small-M projection specialization only where its tiling differs", "[plan][gemm]") {
  // Llama o_proj (N 4096): 256-wide tiles for 8k tokens, 128-wide for 512; qkv (N 6144): 256, and 192 for
  // 512 (4 x 32 tiles in one round over 132 SMs, straddling q | k in 32-row W pieces).
  const plan::KernelPlan hopper = plan::plan_kernels(llama(), config::Arch{9, 0, true});
  REQUIRE(hopper.output_projection_small);
  CHECK(hopper.output_projection.sm90.block_n == 256);
  CHECK(hopper.output_projection_small->sm90.block_n == 128);
  CHECK(hopper.output_projection_small->kernel == plan::GemmKernel::wgmma);
  CHECK(hopper.output_projection_small->weights == hopper.output_projection.weights);
  REQUIRE(hopper.qkv_projection_small);
  CHECK(hopper.qkv_projection.sm90.block_n == 256);
  CHECK(hopper.qkv_projection_small->sm90.block_n == 192);
  const plan::PlannedKernel& small = hopper.kernels.back();
  CHECK(small.stage == plan::StageKind::output_projection);
  CHECK(plan::projection_variant_of(small) == plan::ProjectionVariant::small);
  CHECK(plan::projection_variant_of(hopper.kernels[hopper.kernels.size() - 2]) ==
        plan::ProjectionVariant::planned);
  CHECK(small.source.render_stub() != hopper.kernels[hopper.kernels.size() - 2].source.render_stub());
  CHECK(small.dynamic_shared_bytes == hopper.output_projection_small->dynamic_shared_bytes());

  // A plan for at most kSmallLaunchTokens, another arch, or the mma.sync kernel: one specialization.
  config::AttentionConfig short_plan = llama();
  short_plan.max_tokens = plan::kSmallLaunchTokens;
  CHECK_FALSE(plan::plan_kernels(short_plan, config::Arch{9, 0, true}).output_projection_small);
  CHECK_FALSE(plan::plan_kernels(llama(), config::Arch{8, 0, false}).output_projection_small);
  config::AttentionConfig quantized = llama();
  quantized.projection.output.format = config::WeightFormat::mxfp8;
  CHECK_FALSE(plan::plan_kernels(quantized, config::Arch{9, 0, true}).output_projection_small);
}

TEST_CASE("a launch's projection variant: planned, small specialization or dequantized path",
          "[plan][gemm]") {
  using plan::ProjectionVariant;
  using plan::StageKind;
  const config::Arch hopper{9, 0, true};
  const plan::KernelPlan bf16 = plan::plan_kernels(llama(), hopper);
  const int qkv_n = int(plan::qkv_row_width(llama())), hidden = llama().hidden_size;
  // 512 tokens on 132 SMs: q|k|v's 192-wide and o's 128-wide tiles fill one round; 8k keeps the plan's.
  CHECK(plan::launched_projection_variant(bf16, StageKind::qkv_projection, 512, qkv_n, 132) ==
        ProjectionVariant::small);
  CHECK(plan::launched_projection_variant(bf16, StageKind::output_projection, 512, hidden, 132) ==
        ProjectionVariant::small);
  CHECK(plan::launched_projection_variant(bf16, StageKind::qkv_projection, 8192, qkv_n, 132) ==
        ProjectionVariant::planned);
  // 66 SMs: o's 128 narrow tiles take two rounds, its 64 wide ones one.
  CHECK(plan::launched_projection_variant(bf16, StageKind::output_projection, 512, hidden, 66) ==
        ProjectionVariant::planned);
  // A weight-only 4-bit plan from its path's min_tokens on; fp8 activations: the one e4m3 GEMM.
  const config::AttentionConfig nvfp4 =
      config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/llama-3.1-8b-nvfp4.json");
  const plan::KernelPlan quantized = plan::plan_kernels(nvfp4, hopper);
  REQUIRE(quantized.qkv_projection_dequantized);
  const int from = quantized.qkv_projection_dequantized->min_tokens;
  CHECK(plan::launched_projection_variant(quantized, StageKind::qkv_projection, from, qkv_n, 132) ==
        ProjectionVariant::dequantized);
  CHECK(plan::launched_projection_variant(quantized, StageKind::qkv_projection, from - 1, qkv_n, 132) ==
        ProjectionVariant::planned);
  const config::AttentionConfig fp8 =
      config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/llama-3.1-8b-fp8-dynamic.json");
  CHECK(plan::launched_projection_variant(plan::plan_kernels(fp8, hopper), StageKind::output_projection, 512,
                                          hidden, 132) == ProjectionVariant::planned);
  CHECK_THROWS_AS(plan::launched_projection_variant(bf16, StageKind::attention, 512, qkv_n, 132), Error);
  CHECK_THROWS_AS(plan::projection_variant_kernels(StageKind::attention, ProjectionVariant::planned), Error);
}

TEST_CASE("every projection variant a launch can take is compiled, and no other", "[plan][gemm]") {
  // A plan compiles a kernel only where some launch length runs it (projection_variant_kernels of the variant
  // launched_projection_variant picks): act-order GPTQ's dequantized path takes every launch, so its planned
  // mma.sync GEMMs are not compiled.
  const auto load = [](const char* name) {
    return config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/" + name + ".json");
  };
  int unplanned = 0;
  for (const char* name : {"llama-3.1-8b", "llama-3.1-8b-gptq", "llama-3.1-8b-gptq-noact", "llama-3.1-8b-awq",
                           "llama-3.1-8b-nvfp4", "llama-3.1-8b-mlx-4bit", "llama-3.1-8b-fp8",
                           "llama-3.1-8b-fp8-dynamic", "gpt-oss-20b-mxfp4", "qwen3-8b-fp8-block"}) {
    for (const config::Arch arch : {config::Arch{9, 0, true}, config::Arch{8, 0, false}}) {
      const config::AttentionConfig config = load(name);
      if (arch.major == 8 && config.projection.qkv.activation != config::ActivationType::bf16) continue;
      INFO(name << " on " << arch.name());
      const plan::KernelPlan kernels = plan::plan_kernels(config, arch);
      std::set<std::string> compiled, launched;
      for (const plan::PlannedKernel& kernel : kernels.kernels) {
        if (kernel.stage == plan::StageKind::qkv_projection ||
            kernel.stage == plan::StageKind::output_projection)
          compiled.insert(kernel.name);
      }
      for (const plan::StageKind stage :
           {plan::StageKind::qkv_projection, plan::StageKind::output_projection}) {
        const bool qkv = stage == plan::StageKind::qkv_projection;
        const int n = int(qkv ? plan::qkv_row_width(config) : config.hidden_size);
        for (int tokens = 1; tokens <= config.max_tokens; tokens += tokens < 1100 ? 1 : 97) {
          for (std::string_view kernel : plan::projection_variant_kernels(
                   stage, plan::launched_projection_variant(kernels, stage, tokens, n, 132))) {
            launched.insert(std::string(kernel));
          }
        }
      }
      // An fp8-activation plan's quantizer is its own stage; its GEMMs are the planned ones.
      CHECK(launched == compiled);
      unplanned += compiled.count(std::string(plan::kQkvProjectionName)) == 0 ? 1 : 0;
    }
  }
  CHECK(unplanned == 1);  // act-order GPTQ on sm_90a
}

TEST_CASE("the q|k|v GEMM normalizes and rotates in its epilogue where its tiles hold whole heads",
          "[plan][gemm][qkv_postprocess]") {
  const config::Arch hopper{9, 0, true};
  const config::AttentionConfig config = llama();
  const int qkv_n = int(plan::qkv_row_width(config));
  const plan::KernelPlan kernels = plan::plan_kernels(config, hopper);
  // Llama-3.1-8B: the 256-wide plan tiling holds two heads a tile; the 192-wide short-launch one splits
  // heads, so launches that take it keep the postprocess kernel.
  REQUIRE(kernels.qkv_projection.postprocess);
  CHECK(kernels.qkv_projection.postprocess->rotary_dim == 128);
  REQUIRE(kernels.qkv_projection_small);
  CHECK_FALSE(kernels.qkv_projection_small->postprocess);
  CHECK(kernels.has(plan::StageKind::qkv_postprocess));
  CHECK_FALSE(kernels.output_projection.postprocess);
  CHECK(kernels.input_norm.rotary_pairs == 64);
  CHECK(kernels.kernels[0].source.render_stub().find("/*rotary_pairs=*/64") != std::string::npos);
  CHECK(kernels.kernels[1].source.render_stub().find(
            "/*qkv_epilogue=*/attnplan::kernels::QkvEpilogueTraits<32, 8, 128, 128, 0, 128, 128, false") !=
        std::string::npos);
  CHECK(plan::qkv_postprocess_fused(kernels, 8192, qkv_n, 132));
  CHECK_FALSE(plan::qkv_postprocess_fused(kernels, 512, qkv_n, 132));
  CHECK(plan::launched_qkv_gemm(kernels, 512, qkv_n, 132) == &*kernels.qkv_projection_small);

  // Every launch fused (N 768 at D 64: the 192-wide plan tiling and the 128-wide short-launch one both
  // hold whole heads): no postprocess kernel.
  config::AttentionConfig narrow = config;
  narrow.hidden_size = 512;
  narrow.query_heads = 8;
  narrow.kv_heads = 2;
  narrow.head_dim = 64;
  narrow.value_head_dim = 64;
  narrow.rotary.dim = 64;
  narrow.max_tokens = 4096;
  const plan::KernelPlan all_fused = plan::plan_kernels(narrow, hopper);
  REQUIRE(all_fused.qkv_projection.postprocess);
  REQUIRE(all_fused.qkv_projection_small);
  CHECK(all_fused.qkv_projection_small->postprocess);
  CHECK_FALSE(all_fused.has(plan::StageKind::qkv_postprocess));
  CHECK(all_fused.input_norm.rotary_pairs == 32);

  // Weight-only formats: the dequantized path's bf16 GEMM fuses, the decoding kernel does not.
  const config::AttentionConfig nvfp4 =
      config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/llama-3.1-8b-nvfp4.json");
  const plan::KernelPlan quantized = plan::plan_kernels(nvfp4, hopper);
  REQUIRE(quantized.qkv_projection_dequantized);
  CHECK(quantized.qkv_projection_dequantized->gemm.postprocess);
  CHECK_FALSE(quantized.qkv_projection.postprocess);
  CHECK(quantized.has(plan::StageKind::qkv_postprocess));
  CHECK(plan::qkv_postprocess_fused(quantized, 8192, qkv_n, 132));
  CHECK_FALSE(plan::qkv_postprocess_fused(quantized, 256, qkv_n, 132));

  // mma.sync (sm_80) and the sm_89 e4m3 GEMM never fuse; nor does a norm write a table then.
  const plan::KernelPlan ampere = plan::plan_kernels(config, config::Arch{8, 0, false});
  CHECK_FALSE(ampere.qkv_projection.postprocess);
  CHECK(ampere.input_norm.rotary_pairs == 0);
  CHECK_FALSE(plan::qkv_postprocess_fused(ampere, 8192, qkv_n, 108));
  const config::AttentionConfig fp8 =
      config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/llama-3.1-8b-fp8-dynamic.json");
  const plan::KernelPlan ada = plan::plan_kernels(fp8, config::Arch{8, 9, false});
  REQUIRE(ada.qkv_projection_fp8);
  CHECK_FALSE(ada.qkv_projection_fp8->postprocess);
  CHECK(ada.input_norm.rotary_pairs == 0);
  CHECK_FALSE(plan::qkv_postprocess_fused(ada, 8192, qkv_n, 128));
  CHECK(ada.has(plan::StageKind::qkv_postprocess));
  // The sm_90a e4m3 GEMM fuses it as the bf16 wgmma GEMM does (its 128-wide tiles hold whole heads), at
  // every launch length: it has no short-launch specializations.
  const plan::KernelPlan fp8_kernels = plan::plan_kernels(fp8, hopper);
  REQUIRE(fp8_kernels.qkv_projection_fp8);
  CHECK(fp8_kernels.qkv_projection_fp8->postprocess);
  CHECK_FALSE(fp8_kernels.qkv_projection.postprocess);
  CHECK(fp8_kernels.input_norm.rotary_pairs == 64);
  CHECK(plan::launched_qkv_gemm(fp8_kernels, 8192, qkv_n, 132) == nullptr);
  CHECK(plan::qkv_postprocess_fused(fp8_kernels, 8192, qkv_n, 132));
  CHECK(plan::qkv_postprocess_fused(fp8_kernels, 1, qkv_n, 132));
  CHECK_FALSE(fp8_kernels.has(plan::StageKind::qkv_postprocess));
}

TEST_CASE("a config with nothing to postprocess skips that kernel", "[plan]") {
  config::AttentionConfig config = llama();
  config.rotary.dim = 0;  // no RoPE, no norms
  const plan::KernelPlan kernels = plan::plan_kernels(config, config::kDefaultArch);
  CHECK_FALSE(kernels.has(plan::StageKind::qkv_postprocess));
  CHECK(kernels.kernels.size() == 7);  // with both projections' small-M specializations
}

TEST_CASE("formats the kernels cannot run yet are refused with their JSON path", "[plan]") {
  config::AttentionConfig config = llama();
  config.kv_cache.dtype = config::KvCacheDtype::fp8_e4m3;  // runs: not among the problems
  config.projection.qkv.format = config::WeightFormat::packed_integer;
  config.projection.qkv.group_size = 36;  // 8 consecutive k would straddle two groups: no GEMM policy
  try {
    plan::plan_kernels(config, config::kDefaultArch);
    FAIL("expected an error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::config);
    REQUIRE(error.details().size() == 1);
    CHECK(error.details()[0].rfind("/projection/format", 0) == 0);
  }
}

TEST_CASE("an fp8 KV cache plans the fp8 store and attention specializations", "[plan][fp8kv]") {
  config::AttentionConfig config = llama();
  const plan::KernelPlan bf16 = plan::plan_kernels(config, config::kDefaultArch);
  CHECK_FALSE(bf16.kv_store.fp8_cache);
  CHECK_FALSE(bf16.attention.kv_fp8);
  config.kv_cache.dtype = config::KvCacheDtype::fp8_e4m3;
  config.kv_cache.k_scale = 0.05;
  const plan::KernelPlan fp8 = plan::plan_kernels(config, config::kDefaultArch);
  CHECK(fp8.kv_store.fp8_cache);
  CHECK(fp8.attention.kv_fp8);
  CHECK(fp8.kv_store.source().render_stub().find("/*fp8_cache=*/true") != std::string::npos);
  CHECK(fp8.attention.source().render_stub().find("/*kv_fp8=*/true") != std::string::npos);
  CHECK(bf16.kv_store.source().render_stub().find("/*fp8_cache=*/false") != std::string::npos);
  // The scales are run-time values: two calibrations share one set of binaries.
  config.kv_cache.k_scale = 0.5;
  const plan::KernelPlan other = plan::plan_kernels(config, config::kDefaultArch);
  for (std::size_t i = 0; i < fp8.kernels.size(); ++i)
    CHECK(other.kernels[i].source.render_stub() == fp8.kernels[i].source.render_stub());
}

TEST_CASE("specs carry the config's shapes into named template arguments", "[plan]") {
  config::AttentionConfig config = llama();
  const plan::KernelPlan kernels = plan::plan_kernels(config, config::kDefaultArch);
  CHECK(kernels.input_norm.hidden_size == 4096);
  CHECK_FALSE(kernels.input_norm.unit_offset);
  CHECK(kernels.kv_store.kv_heads == 8);
  CHECK(kernels.kv_store.head_dim == 128);
  CHECK(kernels.kv_store.block_size == config.kv_cache.block_size);

  const std::string stub = kernels.kernels[0].source.render_stub();
  CHECK(stub.find("/*hidden_size=*/4096") != std::string::npos);
  CHECK(stub.find("/*unit_offset=*/false") != std::string::npos);
  CHECK(stub.find("#include \"attnplan/rmsnorm.cuh\"") != std::string::npos);
  const std::string kv_stub = kernels.kv_store.source().render_stub();
  CHECK(kv_stub.find("/*kv_heads=*/8") != std::string::npos);
  CHECK(kv_stub.find("/*block_size=*/") != std::string::npos);

  config.input_norm.weight_offset = 1.0;
  config.kv_cache.block_size = 64;
  const plan::KernelPlan gemma_like = plan::plan_kernels(config, config::kDefaultArch);
  CHECK(gemma_like.input_norm.unit_offset);
  CHECK(gemma_like.kernels[0].source.render_stub().find("/*unit_offset=*/true") != std::string::npos);
  CHECK(gemma_like.kv_store.source().render_stub().find("/*block_size=*/64") != std::string::npos);
}

TEST_CASE("quantized projections with a GEMM policy are planned with it", "[plan][quantized]") {
  config::AttentionConfig config = llama();
  config.projection.qkv.format = config::WeightFormat::mxfp4;
  config.projection.output.format = config::WeightFormat::fp8;
  config.projection.output.scale_granularity = config::Fp8ScaleGranularity::block;
  const plan::KernelPlan kernels = plan::plan_kernels(config, config::kDefaultArch);
  CHECK(kernels.qkv_projection.weights == config.projection.qkv);
  CHECK(kernels.output_projection.weights == config.projection.output);
  for (const auto& kernel : kernels.kernels) {
    // The dequantized path's GEMMs read bf16 (tests/plan/dequantized_plan_test.cpp); the other kernels of
    // the stage carry the format's policy.
    const plan::ProjectionVariant variant = plan::projection_variant_of(kernel);
    if (variant == plan::ProjectionVariant::dequantized ||
        variant == plan::ProjectionVariant::dequantized_small)
      continue;
    if (kernel.stage == plan::StageKind::qkv_projection)
      CHECK(kernel.source.render_stub().find("Mxfp4Weights") != std::string::npos);
    if (kernel.stage == plan::StageKind::output_projection)
      CHECK(kernel.source.render_stub().find("Fp8Weights<2>") != std::string::npos);
  }
  // fp8 activations on an arch without the e4m3 GEMM: refused, naming the field, the arch and the rule
  // (tests/plan/fp8_activation_plan_test.cpp plans them on sm_90a).
  config.projection.output.activation = config::ActivationType::fp8;
  try {
    plan::plan_kernels(config, config::Arch{8, 0, false});
    FAIL("expected an error");
  } catch (const Error& error) {
    REQUIRE(error.details().size() == 1);
    CHECK(error.details()[0].rfind("/projection/output/activation: fp8 activations are not supported by the "
                                   "kernels yet on sm_80: sm_80 has no fp8 tensor cores",
                                   0) == 0);
  }
}

TEST_CASE("D 64's short-launch attention kernel is planned beside the attention kernel", "[plan]") {
  config::AttentionConfig config = llama();
  config.head_dim = config.value_head_dim = 64;
  const config::Arch sm90a{9, 0, true};
  const plan::KernelPlan kernels = plan::plan_kernels(config, sm90a);
  REQUIRE(kernels.attention.tiling.block_m == 192);
  REQUIRE(kernels.attention_short.has_value());
  CHECK(*kernels.attention_short == *plan::short_launch_specialization(kernels.attention));
  const auto named = [](const plan::KernelPlan& plan, std::string_view name) {
    return std::find_if(plan.kernels.begin(), plan.kernels.end(),
                        [&](const plan::PlannedKernel& k) { return k.name == name; });
  };
  const auto attention = named(kernels, "attention"),
             short_launch = named(kernels, plan::kAttentionShortKernel);
  REQUIRE(short_launch != kernels.kernels.end());
  CHECK(short_launch == attention + 1);  // no split kernel: causal
  CHECK(short_launch->stage == plan::StageKind::attention);
  CHECK(short_launch->source.render_stub() == kernels.attention_short->source().render_stub());
  CHECK(short_launch->dynamic_shared_bytes == kernels.attention_short->dynamic_shared_bytes());
  // With spans the split kernel comes first, then the short one.
  config.bidirectional_spans = true;
  const plan::KernelPlan spans = plan::plan_kernels(config, sm90a);
  REQUIRE(spans.attention_split.has_value());
  REQUIRE(spans.attention_short.has_value());
  const auto split_at = named(spans, plan::kAttentionSplitKernel);
  REQUIRE(split_at + 1 < spans.kernels.end());
  CHECK((split_at + 1)->name == plan::kAttentionShortKernel);
  // Not at D 128, on sm_80 or with an fp8 cache; traced with the trace (the kernel a short launch runs).
  CHECK_FALSE(plan::plan_kernels(llama(), sm90a).attention_short.has_value());
  CHECK_FALSE(plan::plan_kernels(config, config::Arch{8, 0, false}).attention_short.has_value());
  config::AttentionConfig fp8 = config;
  fp8.kv_cache.dtype = config::KvCacheDtype::fp8_e4m3;
  CHECK_FALSE(plan::plan_kernels(fp8, sm90a).attention_short.has_value());
  plan::PlanOptions traced;
  traced.trace_attention = true;
  const plan::KernelPlan traced_kernels = plan::plan_kernels(config, sm90a, traced);
  REQUIRE(traced_kernels.attention_short.has_value());
  CHECK(traced_kernels.attention_short->traces);
  CHECK(named(traced_kernels, plan::kAttentionShortKernel) != traced_kernels.kernels.end());
}

TEST_CASE("a launch's attention kernel: short, split or planned, as execute chooses", "[plan]") {
  // Llama's heads at D 64 with bidirectional spans on sm_90a: the planned kernel (192 rows: 48 tokens of 4
  // heads an item), its split-tail and its short-launch specializations (128 rows: 32 tokens).
  config::AttentionConfig config = llama();
  config.head_dim = config.value_head_dim = 64;
  config.bidirectional_spans = true;
  const config::Arch sm90a{9, 0, true};
  const plan::KernelPlan kernels = plan::plan_kernels(config, sm90a);
  REQUIRE(kernels.attention_short.has_value());
  REQUIRE(kernels.attention_split.has_value());
  const int heads = config.query_heads;
  const auto launch = [&](const std::vector<int>& starts, const std::vector<int>& contexts,
                          const std::vector<int>& offsets, const std::vector<int>& bounds) {
    return plan::launched_attention(kernels, starts, contexts, offsets, bounds, heads, 132,
                                    plan::kMaxTailSplitUnits);
  };
  // One 1024-token prompt, one span: 32 x 8 = 256 short items, two rounds of 132 as the planned kernel's
  // 22 x 8 = 176, so the short kernel (the bench's D 64 bidirectional 1k row); walked sequence-major.
  const std::vector<int> no_context = {0}, one_offsets = {0, 1};
  const plan::AttentionLaunch one_k = launch({0, 1024}, no_context, one_offsets, {0, 1024});
  CHECK(one_k.variant == plan::AttentionVariant::short_launch);
  CHECK(one_k.order == std::vector<int>{0});
  CHECK(one_k.split == plan::TailSplit{});
  // 4096 tokens: 1024 short items (eight rounds) against 86 x 8 = 688 planned ones (five rounds and 28
  // items), whose last round splits in four.
  const plan::AttentionLaunch four_k = launch({0, 4096}, no_context, one_offsets, {0, 4096});
  CHECK(four_k.variant == plan::AttentionVariant::split);
  CHECK(four_k.split == plan::TailSplit{28, 4});
  // Causal (no span arrays): the tile-major walk, which never splits; the planned kernel.
  const plan::AttentionLaunch causal = launch({0, 4096}, no_context, {}, {});
  CHECK(causal.variant == plan::AttentionVariant::planned);
  CHECK(causal.order.empty());
  // Each variant's name and spec; a variant the plan lacks is an internal error.
  CHECK(plan::attention_kernel_name(plan::AttentionVariant::planned) == "attention");
  CHECK(plan::attention_kernel_name(plan::AttentionVariant::short_launch) == plan::kAttentionShortKernel);
  CHECK(plan::attention_kernel_name(plan::AttentionVariant::split) == plan::kAttentionSplitKernel);
  // The name -> variant lookup the plan's loader keys its kernels by, and every kernel the plan lists for
  // the attention stage has one.
  for (const plan::AttentionVariant variant :
       {plan::AttentionVariant::planned, plan::AttentionVariant::short_launch, plan::AttentionVariant::split})
    CHECK(plan::attention_variant_named(plan::attention_kernel_name(variant)) == variant);
  CHECK_THROWS_AS(plan::attention_variant_named("qkv_projection"), Error);
  for (const plan::PlannedKernel& planned : kernels.kernels)
    if (planned.stage == plan::StageKind::attention)
      CHECK_NOTHROW(plan::attention_variant_named(planned.name));
  CHECK(&plan::attention_variant_spec(kernels, plan::AttentionVariant::short_launch) ==
        &*kernels.attention_short);
  CHECK(&plan::attention_variant_spec(kernels, plan::AttentionVariant::split) == &*kernels.attention_split);
  CHECK(&plan::attention_variant_spec(kernels, plan::AttentionVariant::planned) == &kernels.attention);
  const plan::KernelPlan causal_kernels = plan::plan_kernels(llama(), sm90a);  // D 128, causal: neither
  CHECK_THROWS_AS(plan::attention_variant_spec(causal_kernels, plan::AttentionVariant::short_launch), Error);
  CHECK_THROWS_AS(plan::attention_variant_spec(causal_kernels, plan::AttentionVariant::split), Error);
  // mma.sync (sm_80): always the planned kernel, no order.
  const plan::KernelPlan sm80 = plan::plan_kernels(config, config::Arch{8, 0, false});
  const plan::AttentionLaunch on_sm80 =
      plan::launched_attention(sm80, std::vector<int>{0, 1024}, no_context, one_offsets,
                               std::vector<int>{0, 1024}, heads, 132, plan::kMaxTailSplitUnits);
  CHECK(on_sm80.variant == plan::AttentionVariant::planned);
  CHECK(on_sm80.order.empty());
}

TEST_CASE("the split tail's kernel and partials are planned where the attention kernel can split", "[plan]") {
  // Llama with bidirectional spans on sm_90a: D 128, two consumer warpgroups, kMaxTailSplitUnits parts of
  // 256 threads x (64 + 4) floats; the counters after them.
  config::AttentionConfig spans = llama();
  spans.bidirectional_spans = true;
  const config::Arch sm90a{9, 0, true};
  const plan::KernelPlan kernels = plan::plan_kernels(spans, sm90a);
  REQUIRE(kernels.attention.kernel == plan::AttentionKernel::wgmma_sm90);
  // The split tail's kernel is planned beside the attention kernel, which runs without the merge's code.
  CHECK_FALSE(kernels.attention.splits_tail);
  REQUIRE(kernels.attention_split.has_value());
  CHECK(*kernels.attention_split == *plan::split_tail_specialization(kernels.attention));
  const auto named = [&](const plan::KernelPlan& plan, std::string_view name) {
    return std::find_if(plan.kernels.begin(), plan.kernels.end(),
                        [&](const plan::PlannedKernel& k) { return k.name == name; });
  };
  const auto attention = named(kernels, "attention"), split = named(kernels, plan::kAttentionSplitKernel);
  REQUIRE(split != kernels.kernels.end());
  CHECK(split == attention + 1);
  CHECK(split->stage == plan::StageKind::attention);
  CHECK(split->source.render_stub() == kernels.attention_split->source().render_stub());
  CHECK(split->dynamic_shared_bytes == attention->dynamic_shared_bytes);
  CHECK(plan::projection_variant_of(*split) == plan::ProjectionVariant::planned);
  const plan::WorkspaceLayout layout = plan::plan_workspace(spans, kernels, 4096);
  CHECK(layout.attention_partials_bytes == std::size_t(plan::kMaxTailSplitUnits) * 256 * (64 + 4) * 4);
  CHECK(layout.attention_partial_units == plan::kMaxTailSplitUnits);
  CHECK(layout.attention_partials % 256 == 0);
  CHECK(layout.attention_items == layout.attention_partials + layout.attention_partials_bytes);
  CHECK(layout.bytes == layout.attention_items + plan::kAttentionCounterBytes);
  // Causal (no spans: the items never cost the same) and sm_80 (mma.sync): none, and no split kernel. D 256
  // splits (since session 53): its parts hold 256 threads x (128 + 4) floats.
  const plan::KernelPlan causal = plan::plan_kernels(llama(), sm90a);
  CHECK_FALSE(causal.attention_split.has_value());
  CHECK(named(causal, plan::kAttentionSplitKernel) == causal.kernels.end());
  CHECK(plan::plan_workspace(llama(), causal, 4096).attention_partials_bytes == 0);
  CHECK(plan::plan_workspace(spans, plan::plan_kernels(spans, config::Arch{8, 0, false}), 4096)
            .attention_partials_bytes == 0);
  config::AttentionConfig wide = spans;
  wide.head_dim = wide.value_head_dim = 256;
  const plan::KernelPlan wide_kernels = plan::plan_kernels(wide, sm90a);
  REQUIRE(wide_kernels.attention_split.has_value());
  CHECK(wide_kernels.attention_split->tiling == wide_kernels.attention.tiling);
  CHECK(plan::plan_workspace(wide, wide_kernels, 4096).attention_partials_bytes ==
        std::size_t(plan::kMaxTailSplitUnits) * 256 * (128 + 4) * 4);
}
