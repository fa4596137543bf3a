// From an AttentionConfig to the list of kernels its prefill plan runs: a pure function, no GPU, no
// compiler. Each planned kernel carries its typed spec rendered to a KernelSource.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/kernel_source.hpp"
#include "config/attention_config.hpp"
#include "plan/attention_spec.hpp"
#include "plan/gemm_spec.hpp"
#include "plan/kernel_specs.hpp"
#include "plan/qkv_postprocess_spec.hpp"

namespace attnplan::plan {

// The plan's stages in launch order (design.md, spec sections 1-7).
enum class StageKind { input_norm, qkv_projection, qkv_postprocess, kv_store, attention, output_projection };

std::string_view to_string(StageKind stage);

struct PlannedKernel {
  StageKind stage;
  std::string name;  // stable, human-readable: "input_rmsnorm", "qkv_projection", ...
  compiler::KernelSource source;
  int dynamic_shared_bytes = 0;  // allowed on the function at load when above the 48 KiB default
};

struct KernelPlan {
  RmsNormSpec input_norm;
  GemmSpec qkv_projection;             // [T, hidden] x [q | k | v, hidden]^T -> the fused qkv rows
  QkvPostprocessSpec qkv_postprocess;  // q/k/v norms and RoPE in place; skipped when it has no work
  KvStoreSpec kv_store;
  AttentionSpec attention;
  GemmSpec output_projection;  // [T, Hq * Dv] x [hidden, Hq * Dv]^T
  // The projections' kSmallLaunchTokens specializations (wgmma, another block_n), planned only when their
  // tiling differs from the max_tokens one; each launch picks one by choose_gemm_variant.
  std::optional<GemmSpec> qkv_projection_small, output_projection_small;
  std::vector<PlannedKernel> kernels;  // in launch order; a small specialization right after its stage's

  bool has(StageKind stage) const;
};

// The names of the small specializations' kernels (same StageKind as the planned projection).
inline constexpr std::string_view kQkvProjectionSmallName = "qkv_projection_small";
inline constexpr std::string_view kOutputProjectionSmallName = "output_projection_small";
bool is_small_variant(const PlannedKernel& kernel);

// Throws Error(config) when the config asks for something the kernels cannot do yet (a quantized
// projection format, an fp8 KV cache, a head dim the attention kernel does not support).
KernelPlan plan_kernels(const config::AttentionConfig& config, const config::Arch& arch);

// Elements of one row of the fused QKV buffer: Hq * D + Hkv * D + Hkv * Dv.
long long qkv_row_width(const config::AttentionConfig& config);

}  // namespace attnplan::plan
