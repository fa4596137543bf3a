// fp8 activations in the plan (kernel_plan.hpp, prefill_plan.hpp's plan_workspace): from sm_89 an e4m3
// GEMM (wgmma on sm_90a, mma.sync elsewhere) fed by the input norm's own codes (q|k|v) or a quantize stage
// (the output projection), the workspace grown by the quantized rows; before sm_89 a refusal that names
// the field, the arch and the rule. Host only (plus one NVRTC compile for sm_89).
#include <string>
#include <vector>

#include "config/parse.hpp"
#include "core/error.hpp"
#include "plan/kernel_plan.hpp"
#include "plan/prefill_plan.hpp"
#include "plan/runtime.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;

namespace {

config::AttentionConfig fp8act() {
  return config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/qwen3-8b-fp8-block-fp8act.json");
}

const config::Arch kSm80{8, 0, false}, kSm89{8, 9, false}, kSm90{9, 0, false}, kSm90a{9, 0, true};

// The one detail of the Error(config) plan_kernels throws for `config` on `arch`.
std::string refusal(const config::AttentionConfig& config, const config::Arch& arch) {
  try {
    plan::plan_kernels(config, arch);
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::config);
    REQUIRE(error.details().size() >= 1);
    return error.details()[0];
  }
  FAIL("expected plan_kernels to refuse");
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("fp8 activations on sm_90a: the norm's codes or a quantize stage before each e4m3 GEMM",
          "[plan][fp8_activation]") {
  const config::AttentionConfig config = fp8act();
  const plan::KernelPlan kernels = plan::plan_kernels(config, kSm90a);
  std::vector<std::string> names;
  std::vector<plan::StageKind> stages;
  for (const auto& kernel : kernels.kernels) {
    names.push_back(kernel.name);
    stages.push_back(kernel.stage);
  }
  // The norm writes the q|k|v projection's codes (8-channel vectors: hidden is a multiple of 16).
  CHECK(kernels.input_norm.fp8_codes == config::Fp8ActivationScales::token_group);
  CHECK(kernels.input_norm.tiling.vector == 8);
  CHECK(contains(kernels.kernels[0].source.render_stub(), "/*fp8_codes=*/true"));
  // The q/k norms and RoPE run in the e4m3 GEMM's epilogue (128-wide tiles hold whole D 128 heads), the
  // rotation table from the norm beside its codes: no qkv_postprocess stage.
  CHECK(names == std::vector<std::string>{"input_rmsnorm", "qkv_projection", "kv_store", "attention",
                                          "output_quantize", "output_projection"});
  CHECK(stages == std::vector<plan::StageKind>{plan::StageKind::input_norm, plan::StageKind::qkv_projection,
                                               plan::StageKind::kv_store, plan::StageKind::attention,
                                               plan::StageKind::output_quantize,
                                               plan::StageKind::output_projection});
  REQUIRE(kernels.qkv_projection_fp8.has_value());
  REQUIRE(kernels.qkv_projection_fp8->postprocess.has_value());
  CHECK(kernels.qkv_projection_fp8->postprocess->query_norm);
  CHECK(kernels.input_norm.rotary_pairs == 64);
  CHECK(contains(kernels.kernels[0].source.render_stub(), "/*rotary_pairs=*/64"));
  CHECK(contains(kernels.kernels[1].source.render_stub(),
                 "/*qkv_epilogue=*/attnplan::kernels::QkvEpilogueTraits"));
  CHECK(plan::qkv_postprocess_fused(kernels, 8192, int(plan::qkv_row_width(config)), 132));
  REQUIRE(kernels.output_projection_fp8.has_value());
  CHECK(kernels.qkv_projection_fp8->segments == 3);
  CHECK_FALSE(kernels.qkv_projection_fp8->has_bias);
  CHECK(kernels.qkv_projection_fp8->granularity == config::Fp8ScaleGranularity::block);
  CHECK(kernels.output_projection_fp8->segments == 1);
  CHECK_FALSE(kernels.output_projection_fp8->postprocess.has_value());
  // The e4m3 GEMM replaces the bf16 one and never comes with a 512-token specialization.
  CHECK_FALSE(kernels.qkv_projection_small.has_value());
  CHECK_FALSE(kernels.output_projection_small.has_value());
  CHECK_FALSE(kernels.qkv_projection_tiny.has_value());
  CHECK_FALSE(kernels.output_projection_tiny.has_value());
  for (const auto& kernel : kernels.kernels) {
    INFO(kernel.name);
    if (kernel.stage == plan::StageKind::output_quantize) {
      CHECK(kernel.source.family == "fp8_quantize");
      CHECK(kernel.dynamic_shared_bytes == 0);
    }
    if (kernel.stage == plan::StageKind::qkv_projection ||
        kernel.stage == plan::StageKind::output_projection) {
      CHECK(kernel.source.family == "gemm_sm90_fp8");
      CHECK(contains(kernel.source.render_stub(), "/*granularity=*/2"));
      CHECK(kernel.dynamic_shared_bytes == kernels.qkv_projection_fp8->dynamic_shared_bytes());
    }
  }
  // Only the output projection on fp8 activations: one quantize stage, a plain norm.
  config::AttentionConfig output_only = config;
  output_only.projection.qkv.activation = config::ActivationType::bf16;
  const plan::KernelPlan partial = plan::plan_kernels(output_only, kSm90a);
  CHECK_FALSE(partial.qkv_projection_fp8.has_value());
  CHECK(partial.output_projection_fp8.has_value());
  CHECK_FALSE(partial.input_norm.fp8_codes.has_value());
  CHECK_FALSE(contains(partial.kernels[0].source.render_stub(), "/*fp8_codes=*/true"));
  CHECK(partial.kernels[1].stage == plan::StageKind::qkv_projection);
  CHECK(partial.has(plan::StageKind::output_quantize));
}

TEST_CASE("fp8 activations grow the workspace by the quantized rows of the larger K",
          "[plan][fp8_activation][workspace]") {
  const config::AttentionConfig config = fp8act();  // hidden 4096, Hq * Dv 4096, q | k | v 6144
  const plan::KernelPlan kernels = plan::plan_kernels(config, kSm90a);
  for (const int tokens : {1, 37, 300, config.max_tokens}) {
    INFO(tokens << " tokens");
    const plan::WorkspaceLayout layout = plan::plan_workspace(config, kernels, tokens);
    const auto align = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
    const std::size_t t = std::size_t(tokens);
    CHECK(layout.qkv == align(t * 4096 * 2));
    CHECK(layout.attention == layout.qkv + align(t * 6144 * 2));
    CHECK(layout.fp8_activations == layout.attention + align(t * 4096 * 2));
    CHECK(layout.fp8_activations % 256 == 0);
    CHECK(layout.fp8_activation_bytes == plan::fp8_activation_bytes(tokens, 4096));
    CHECK(layout.attention_items == align(layout.fp8_activations + layout.fp8_activation_bytes));
    CHECK(layout.bytes == layout.attention_items + plan::kAttentionCounterBytes);  // the attention's counters
  }
  // bf16 activations: nothing added.
  config::AttentionConfig bf16_activations = config;
  bf16_activations.projection.qkv.activation = config::ActivationType::bf16;
  bf16_activations.projection.output.activation = config::ActivationType::bf16;
  const plan::WorkspaceLayout plain =
      plan::plan_workspace(bf16_activations, plan::plan_kernels(bf16_activations, kSm90a), 300);
  CHECK(plain.fp8_activation_bytes == 0);
  CHECK(plain.bytes == plain.fp8_activations + plan::kAttentionCounterBytes);
  // The QKV input is the wider one (K = hidden 2048 < Hq * Dv 4096 here): the region fits the larger.
  config::AttentionConfig wide_output = config;
  wide_output.hidden_size = 2048;
  const plan::WorkspaceLayout wide =
      plan::plan_workspace(wide_output, plan::plan_kernels(wide_output, kSm90a), 300);
  CHECK(wide.fp8_activation_bytes == plan::fp8_activation_bytes(300, 4096));
}

TEST_CASE("fp8 activations with channel weight scales: one activation scale per token, norm and quantizer",
          "[plan][fp8_activation]") {
  // Llama-3.1-8B FP8-Dynamic: fp8 weights with one scale per output channel, activations per token.
  const config::AttentionConfig config =
      config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/llama-3.1-8b-fp8-dynamic.json");
  for (const config::Arch arch : {kSm89, kSm90a}) {
    INFO(arch.name());
    const plan::KernelPlan kernels = plan::plan_kernels(config, arch);
    REQUIRE(kernels.qkv_projection_fp8.has_value());
    REQUIRE(kernels.output_projection_fp8.has_value());
    CHECK(kernels.qkv_projection_fp8->granularity == config::Fp8ScaleGranularity::channel);
    CHECK(kernels.qkv_projection_fp8->activation_scales() == config::Fp8ActivationScales::token);
    CHECK(kernels.input_norm.fp8_codes == config::Fp8ActivationScales::token);
    const std::string norm_stub = kernels.kernels[0].source.render_stub();
    CHECK(contains(norm_stub, "/*fp8_codes=*/true"));
    // sm_90a: the rotation table for the e4m3 GEMM's fused RoPE; sm_89's GEMM leaves RoPE to the
    // postprocess kernel.
    const bool fused = arch.arch_specific;
    CHECK(contains(norm_stub, fused ? "/*rotary_pairs=*/64" : "/*rotary_pairs=*/0"));
    CHECK(kernels.qkv_projection_fp8->postprocess.has_value() == fused);
    CHECK(kernels.has(plan::StageKind::qkv_postprocess) == !fused);
    CHECK(contains(norm_stub, "/*fp8_token_scales=*/true"));
    CHECK(kernels.activation_quantize.scales == config::Fp8ActivationScales::token);
    for (const auto& kernel : kernels.kernels) {
      INFO(kernel.name);
      if (kernel.stage == plan::StageKind::output_quantize) {
        CHECK(kernel.source.family == "fp8_quantize_tokens");
        CHECK(kernel.source.spec["scales"] == "token");
      }
      if (kernel.stage == plan::StageKind::output_projection)
        CHECK(kernel.source.spec["activation_scales"] == "token");
    }
    CHECK(kernels.activation_quantize.launch_shape(300, 4096).grid.x == 300);  // a CTA per token
  }
  // Block weight scales keep a scale per 128 channels: the norm's stub as before this choice existed.
  const plan::KernelPlan block = plan::plan_kernels(fp8act(), kSm90a);
  CHECK(block.input_norm.fp8_codes == config::Fp8ActivationScales::token_group);
  CHECK_FALSE(contains(block.kernels[0].source.render_stub(), "fp8_token_scales"));
  CHECK(block.activation_quantize.scales == config::Fp8ActivationScales::token_group);
  CHECK(block.output_projection_fp8->source().spec["activation_scales"] == "token_group");
}

TEST_CASE("fp8 activations: the mma.sync e4m3 GEMM from sm_89, wgmma on sm_90a, refused before sm_89",
          "[plan][fp8_activation]") {
  const config::AttentionConfig config = fp8act();
  for (const config::Arch arch : {kSm89, kSm90}) {
    INFO(arch.name());
    const plan::KernelPlan kernels = plan::plan_kernels(config, arch);
    REQUIRE(kernels.qkv_projection_fp8.has_value());
    CHECK(kernels.qkv_projection_fp8->kernel == plan::GemmFp8Kernel::mma_sync);
    CHECK(kernels.qkv_projection_fp8->stages == 4);
    CHECK(kernels.qkv_projection_fp8->threads() == 256);
    CHECK(kernels.qkv_projection_fp8->dynamic_shared_bytes() == 4 * 256 * 80);  // inside sm_89's 99 KiB
    CHECK(kernels.input_norm.fp8_codes.has_value());  // the norm writes the codes on every arch
    CHECK(kernels.kernels[1].source.family == "gemm_sm89_fp8");
    CHECK(kernels.kernels[1].dynamic_shared_bytes == 4 * 256 * 80);
    CHECK(kernels.output_projection_fp8->kernel == plan::GemmFp8Kernel::mma_sync);
  }
  CHECK(plan::plan_kernels(config, kSm90a).qkv_projection_fp8->kernel == plan::GemmFp8Kernel::wgmma);

  const std::string sm80 = refusal(config, kSm80);
  CHECK(sm80.rfind("/projection/activation: fp8 activations are not supported by the kernels yet on sm_80",
                   0) == 0);
  CHECK(contains(sm80, "sm_80 has no fp8 tensor cores"));
  CHECK(contains(sm80, "activation \"bf16\""));
  // Only the output projection: the refusal names its field.
  config::AttentionConfig output_only = config;
  output_only.projection.qkv.activation = config::ActivationType::bf16;
  CHECK(refusal(output_only, kSm80).rfind("/projection/output/activation: ", 0) == 0);

  // Shapes the e4m3 GEMMs' 128-wide tiles cannot split: a q segment of 4 x 80 columns.
  config::AttentionConfig narrow = config;
  narrow.query_heads = 4;
  narrow.kv_heads = 4;
  narrow.head_dim = 80;
  narrow.value_head_dim = 80;
  for (const config::Arch arch : {kSm89, kSm90a}) {
    const std::string shape = refusal(narrow, arch);
    CHECK(shape.rfind("/projection/activation: fp8 activations are not supported by the kernels yet for a "
                      "320-wide",
                      0) == 0);
    CHECK(contains(shape, "multiple of 128 columns"));
  }
}

TEST_CASE("the fp8-activation plan compiles for sm_89 with no spills", "[plan][fp8_activation][nvrtc]") {
  testing::TempDir dir;
  RuntimeOptions options;
  options.cache_dir = dir.path();
  options.arch = kSm89;
  Runtime runtime(options, [](const std::string&) {});
  const plan::CompiledPlan compiled = runtime.compile(fp8act());
  CHECK(compiled.kernels.size() == 7);  // no quantizer before q|k|v: the norm writes its codes
  for (const plan::PlanKernel& kernel : compiled.kernels) {
    INFO(kernel.name);
    CHECK(kernel.resources.registers > 0);
    CHECK(kernel.resources.spill_bytes() == 0);
    CHECK(kernel.resources.stack_bytes == 0);
    UNSCOPED_INFO(kernel.name << " sm_89: " << kernel.resources.registers << " registers");
  }
  CHECK(compiled.kernel(plan::StageKind::qkv_projection).source.family == "gemm_sm89_fp8");
}
