#include "plan/kernel_plan.hpp"

namespace attnplan::plan {

std::string_view to_string(StageKind stage) {
  switch (stage) {
    case StageKind::input_norm:
      return "input_norm";
    case StageKind::kv_store:
      return "kv_store";
  }
  return "unknown";
}

KernelPlan plan_kernels(const config::AttentionConfig& config) {
  KernelPlan plan;

  plan.input_norm.hidden_size = config.hidden_size;
  plan.input_norm.unit_offset = config.input_norm.weight_offset != 0.0;
  plan.input_norm.tiling = choose_rmsnorm_tiling(config.hidden_size);

  plan.kv_store.kv_heads = config.kv_heads;
  plan.kv_store.head_dim = config.head_dim;
  plan.kv_store.value_head_dim = config.value_head_dim;
  plan.kv_store.block_size = config.kv_cache.block_size;
  plan.kv_store.tiling = choose_kv_store_tiling(config.kv_heads, config.head_dim, config.value_head_dim);

  plan.kernels.push_back({StageKind::input_norm, "input_rmsnorm", plan.input_norm.source()});
  plan.kernels.push_back({StageKind::kv_store, "kv_store", plan.kv_store.source()});
  return plan;
}

}  // namespace attnplan::plan
