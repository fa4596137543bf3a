#include "plan/kernel_plan.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "plan/gemm_fp8.hpp"

namespace attnplan::plan {

std::string_view to_string(StageKind stage) {
  switch (stage) {
    case StageKind::input_norm:
      return "input_norm";
    case StageKind::qkv_projection:
      return "qkv_projection";
    case StageKind::qkv_postprocess:
      return "qkv_postprocess";
    case StageKind::kv_store:
      return "kv_store";
    case StageKind::attention:
      return "attention";
    case StageKind::output_projection:
      return "output_projection";
  }
  return "unknown";
}

bool is_small_variant(const PlannedKernel& kernel) {
  return kernel.name == kQkvProjectionSmallName || kernel.name == kOutputProjectionSmallName;
}

bool KernelPlan::has(StageKind stage) const {
  for (const PlannedKernel& kernel : kernels) {
    if (kernel.stage == stage) return true;
  }
  return false;
}

long long qkv_row_width(const config::AttentionConfig& config) {
  return static_cast<long long>(config.query_heads) * config.head_dim +
         static_cast<long long>(config.kv_heads) * (config.head_dim + config.value_head_dim);
}

namespace {

void require_supported(const config::AttentionConfig& config, const config::Arch& arch) {
  std::vector<std::string> problems;
  // The GEMM's weight loader policies (gemm_spec.hpp): bf16, fp8 weight-only, mxfp8, mxfp4, nvfp4,
  // packed_integer (GPTQ / AWQ), affine (MLX). fp8 activations: the sm_90a kernels exist (gemm_fp8.hpp)
  // but the plan does not launch them yet.
  const auto unsupported = [&arch](const config::WeightEncoding& encoding) {
    return encoding.format == config::WeightFormat::fp8 && encoding.activation == config::ActivationType::fp8
               ? fmt::format("fp8 weights with fp8 activations on {} ({}) are", arch.name(),
                             fp8_activation_gemm_available(arch)
                                 ? "kernels exist, plan wiring pending"
                                 : "no fp8-activation GEMM for this arch, sm_90a only")
               : fmt::format("{} weights are", config::to_string(encoding.format));
  };
  const std::string supported =
      "(bf16, fp8 with bf16 activations, mxfp8, mxfp4, nvfp4, packed_integer with a group_size that is -1 or "
      "a multiple of 8, and affine are)";
  if (!gemm_supports(config.projection.qkv)) {
    problems.push_back(fmt::format("/projection/format: {} not supported by the kernels yet {}",
                                   unsupported(config.projection.qkv), supported));
  }
  if (config.projection.fused_qkv && config.projection.qkv.format != config::WeightFormat::bf16) {
    problems.push_back(fmt::format("/projection/fused_qkv: a fused qkv_proj is bf16 only, not {}",
                                   config::to_string(config.projection.qkv.format)));
  }
  if (!gemm_supports(config.projection.output)) {
    problems.push_back(fmt::format("/projection/output/format: {} not supported by the kernels yet {}",
                                   unsupported(config.projection.output), supported));
  }
  if (!problems.empty()) {
    throw Error(Stage::config,
                fmt::format("{} cannot be planned yet", config.name.empty() ? "this config" : config.name),
                {}, problems);
  }
}

// The wgmma kernel reads bf16 weights only; quantized formats keep the mma.sync kernel and its loaders.
GemmKernelChoice choose_projection_kernel(const config::WeightEncoding& weights, const config::Arch& arch,
                                          int m_hint, int n, int k, std::span<const int> segment_widths) {
  if (weights.format != config::WeightFormat::bf16) return {};
  return choose_gemm_kernel(arch, m_hint, n, k, segment_widths);
}

// The projection's specialization for kSmallLaunchTokens-row launches, when the wgmma kernel would tile
// those differently from the max_tokens plan (issue #6).
std::optional<GemmSpec> small_specialization(const GemmSpec& planned, const config::AttentionConfig& config,
                                             const config::Arch& arch, int n, int k,
                                             std::span<const int> segment_widths) {
  if (planned.kernel != GemmKernel::wgmma || config.max_tokens <= kSmallLaunchTokens) return std::nullopt;
  const GemmKernelChoice small =
      choose_projection_kernel(planned.weights, arch, kSmallLaunchTokens, n, k, segment_widths);
  if (small.kernel != GemmKernel::wgmma || small.sm90 == planned.sm90) return std::nullopt;
  GemmSpec spec = planned;
  spec.sm90 = small.sm90;
  return spec;
}

}  // namespace

KernelPlan plan_kernels(const config::AttentionConfig& config, const config::Arch& arch) {
  require_supported(config, arch);
  KernelPlan plan;
  const int hidden = config.hidden_size;
  const int attention_width = config.query_heads * config.value_head_dim;

  plan.input_norm.hidden_size = hidden;
  plan.input_norm.unit_offset = config.input_norm.weight_offset != 0.0;
  plan.input_norm.tiling = choose_rmsnorm_tiling(hidden);

  plan.qkv_projection.segments = config.projection.fused_qkv ? 1 : 3;
  plan.qkv_projection.has_bias = config.qkv_bias;
  plan.qkv_projection.weights = config.projection.qkv;
  plan.qkv_projection.tiling =
      choose_gemm_tiling(config.max_tokens, static_cast<int>(qkv_row_width(config)), hidden, arch);
  {
    const int q_width = config.query_heads * config.head_dim;
    const int k_width = config.kv_heads * config.head_dim;
    const int v_width = config.kv_heads * config.value_head_dim;
    const std::vector<int> widths = config.projection.fused_qkv
                                        ? std::vector<int>{q_width + k_width + v_width}
                                        : std::vector<int>{q_width, k_width, v_width};
    const GemmKernelChoice choice = choose_projection_kernel(config.projection.qkv, arch, config.max_tokens,
                                                             q_width + k_width + v_width, hidden, widths);
    plan.qkv_projection.kernel = choice.kernel;
    plan.qkv_projection.sm90 = choice.sm90;
    plan.qkv_projection_small =
        small_specialization(plan.qkv_projection, config, arch, q_width + k_width + v_width, hidden, widths);
  }

  plan.qkv_postprocess = QkvPostprocessSpec::from_config(config);

  plan.kv_store.kv_heads = config.kv_heads;
  plan.kv_store.head_dim = config.head_dim;
  plan.kv_store.value_head_dim = config.value_head_dim;
  plan.kv_store.block_size = config.kv_cache.block_size;
  plan.kv_store.fp8_cache = config.kv_cache.dtype == config::KvCacheDtype::fp8_e4m3;
  plan.kv_store.tiling = choose_kv_store_tiling(config.kv_heads, config.head_dim, config.value_head_dim);

  plan.attention = AttentionSpec::from_config(config, arch);

  plan.output_projection.segments = 1;
  plan.output_projection.has_bias = config.output_bias;
  plan.output_projection.weights = config.projection.output;
  plan.output_projection.tiling = choose_gemm_tiling(config.max_tokens, hidden, attention_width, arch);
  const int output_widths[] = {hidden};
  const GemmKernelChoice output_choice = choose_projection_kernel(
      config.projection.output, arch, config.max_tokens, hidden, attention_width, output_widths);
  plan.output_projection.kernel = output_choice.kernel;
  plan.output_projection.sm90 = output_choice.sm90;
  plan.output_projection_small =
      small_specialization(plan.output_projection, config, arch, hidden, attention_width, output_widths);

  plan.kernels.push_back({StageKind::input_norm, "input_rmsnorm", plan.input_norm.source(), 0});
  plan.kernels.push_back({StageKind::qkv_projection, "qkv_projection", plan.qkv_projection.source(),
                          plan.qkv_projection.dynamic_shared_bytes()});
  if (const auto& small = plan.qkv_projection_small) {
    plan.kernels.push_back({StageKind::qkv_projection, std::string(kQkvProjectionSmallName), small->source(),
                            small->dynamic_shared_bytes()});
  }
  if (plan.qkv_postprocess.has_work()) {
    plan.kernels.push_back({StageKind::qkv_postprocess, "qkv_postprocess", plan.qkv_postprocess.source(), 0});
  }
  plan.kernels.push_back({StageKind::kv_store, "kv_store", plan.kv_store.source(), 0});
  plan.kernels.push_back(
      {StageKind::attention, "attention", plan.attention.source(), plan.attention.dynamic_shared_bytes()});
  plan.kernels.push_back({StageKind::output_projection, "output_projection", plan.output_projection.source(),
                          plan.output_projection.dynamic_shared_bytes()});
  if (const auto& small = plan.output_projection_small) {
    plan.kernels.push_back({StageKind::output_projection, std::string(kOutputProjectionSmallName),
                            small->source(), small->dynamic_shared_bytes()});
  }
  return plan;
}

}  // namespace attnplan::plan
