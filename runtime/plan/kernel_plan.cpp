#include "plan/kernel_plan.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

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

void require_supported(const config::AttentionConfig& config) {
  std::vector<std::string> problems;
  if (config.projection.qkv.format != config::WeightFormat::bf16) {
    problems.push_back(
        fmt::format("/projection/format: {} weights are not supported by the kernels yet (bf16 only)",
                    config::to_string(config.projection.qkv.format)));
  }
  if (config.projection.output.format != config::WeightFormat::bf16) {
    problems.push_back(
        fmt::format("/projection/output/format: {} weights are not supported by the kernels yet (bf16 only)",
                    config::to_string(config.projection.output.format)));
  }
  if (!problems.empty()) {
    throw Error(Stage::config,
                fmt::format("{} cannot be planned yet", config.name.empty() ? "this config" : config.name),
                {}, problems);
  }
}

}  // namespace

KernelPlan plan_kernels(const config::AttentionConfig& config, const config::Arch& arch) {
  require_supported(config);
  KernelPlan plan;
  const int hidden = config.hidden_size;
  const int attention_width = config.query_heads * config.value_head_dim;

  plan.input_norm.hidden_size = hidden;
  plan.input_norm.unit_offset = config.input_norm.weight_offset != 0.0;
  plan.input_norm.tiling = choose_rmsnorm_tiling(hidden);

  plan.qkv_projection.segments = config.projection.fused_qkv ? 1 : 3;
  plan.qkv_projection.has_bias = config.qkv_bias;
  plan.qkv_projection.tiling =
      choose_gemm_tiling(config.max_tokens, static_cast<int>(qkv_row_width(config)), hidden, arch);

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
  plan.output_projection.tiling = choose_gemm_tiling(config.max_tokens, hidden, attention_width, arch);

  plan.kernels.push_back({StageKind::input_norm, "input_rmsnorm", plan.input_norm.source(), 0});
  plan.kernels.push_back({StageKind::qkv_projection, "qkv_projection", plan.qkv_projection.source(),
                          plan.qkv_projection.dynamic_shared_bytes()});
  if (plan.qkv_postprocess.has_work()) {
    plan.kernels.push_back({StageKind::qkv_postprocess, "qkv_postprocess", plan.qkv_postprocess.source(), 0});
  }
  plan.kernels.push_back({StageKind::kv_store, "kv_store", plan.kv_store.source(), 0});
  plan.kernels.push_back(
      {StageKind::attention, "attention", plan.attention.source(), plan.attention.dynamic_shared_bytes()});
  plan.kernels.push_back({StageKind::output_projection, "output_projection", plan.output_projection.source(),
                          plan.output_projection.dynamic_shared_bytes()});
  return plan;
}

}  // namespace attnplan::plan
