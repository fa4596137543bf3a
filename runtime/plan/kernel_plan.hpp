// From an AttentionConfig to the list of kernels its prefill plan runs: a pure function, no GPU, no
// compiler. Each planned kernel carries its typed spec rendered to a KernelSource.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/kernel_source.hpp"
#include "config/attention_config.hpp"
#include "plan/attention_spec.hpp"
#include "plan/gemm_fp8.hpp"
#include "plan/gemm_spec.hpp"
#include "plan/kernel_specs.hpp"
#include "plan/qkv_postprocess_spec.hpp"

namespace attnplan::plan {

// The plan's stages in launch order (design.md, spec sections 1-7). output_quantize runs only before an
// output projection with fp8 activations: its bf16 input -> e4m3 codes + scales in the workspace. A q|k|v
// projection with fp8 activations reads codes the input norm wrote (RmsNormSpec::fp8_codes).
enum class StageKind {
  input_norm,
  qkv_projection,
  qkv_postprocess,
  kv_store,
  attention,
  output_quantize,
  output_projection
};

std::string_view to_string(StageKind stage);

// The name of the attention stage's planned kernel (KernelPlan::attention) in KernelPlan::kernels.
inline constexpr std::string_view kAttentionKernel = "attention";
// The name of the attention stage's split-tail kernel (KernelPlan::attention_split), after the planned one.
inline constexpr std::string_view kAttentionSplitKernel = "attention_split";
// The name of the attention stage's short-launch kernel (KernelPlan::attention_short).
inline constexpr std::string_view kAttentionShortKernel = "attention_short";

struct PlannedKernel {
  StageKind stage;
  std::string name;  // stable, human-readable: "input_rmsnorm", "qkv_projection", ...
  compiler::KernelSource source;
  int dynamic_shared_bytes = 0;  // allowed on the function at load when above the 48 KiB default
};

struct KernelPlan {
  RmsNormSpec input_norm;
  GemmSpec qkv_projection;  // [T, hidden] x [q | k | v, hidden]^T -> the fused qkv rows
  // q/k/v norms and RoPE in place. Its kernel is planned when it has work and some q|k|v GEMM a launch may
  // run does not do it in its epilogue (GemmSpec::postprocess): a launch runs it after such a GEMM only.
  QkvPostprocessSpec qkv_postprocess;
  KvStoreSpec kv_store;
  AttentionSpec attention;
  // The attention kernel with the split tail compiled in (split_tail_specialization), planned where a
  // launch may split (spans, sm_90a): execute launches it, as kAttentionSplitKernel, when
  // choose_tail_split splits the launch, and `attention` otherwise.
  std::optional<AttentionSpec> attention_split;
  // The attention kernel's short-launch specialization (short_launch_specialization: D 64 on two consumer
  // warpgroups), where planned: execute launches it, as kAttentionShortKernel, when takes_short_launch says
  // the launch is short (no split then).
  std::optional<AttentionSpec> attention_short;
  GemmSpec output_projection;  // [T, Hq * Dv] x [hidden, Hq * Dv]^T
  // fp8 activations (fp8 weights with activation "fp8", sm_89 and later): this e4m3 GEMM instead of the
  // GemmSpec above, on codes the input norm (q|k|v) or the quantizer (output_quantize) wrote. Empty
  // otherwise.
  std::optional<GemmFp8Spec> qkv_projection_fp8;
  std::optional<GemmFp8Spec> output_projection_fp8;
  Fp8QuantizeSpec activation_quantize;  // output_quantize's quantizer (its scales: output_projection_fp8's)
  // The projections' short-launch specializations (wgmma: kSmallLaunchTokens, wgmma_decode:
  // kDecodeSmallLaunchTokens; the same kernel, another tiling), planned only when their tiling differs
  // from the planned one, and the decoding kernel's one-row-tile specialization (kDecodeTinyLaunchTokens),
  // planned only when its tiling differs from both; each launch takes the one of least gemm_sm90_cost
  // (launched_projection_variant).
  std::optional<GemmSpec> qkv_projection_small, output_projection_small;
  std::optional<GemmSpec> qkv_projection_tiny, output_projection_tiny;
  // The dequantized path of a weight-only quantized projection (choose_dequantized_gemm): launches of at
  // least min_tokens rows (dequantized_min_tokens of the planned projection) run `dequantize` into the
  // workspace, then `gemm` (bf16 wgmma, tiled for max_tokens) or, where the bf16 plan's short-launch
  // tiling differs, `gemm_small` (that tiling), the one of least gemm_sm90_cost
  // (launched_projection_variant).
  struct Dequantized {
    DequantizeSpec dequantize;
    GemmSpec gemm;
    std::optional<GemmSpec> gemm_small;
    int min_tokens = 0;
  };
  std::optional<Dequantized> qkv_projection_dequantized, output_projection_dequantized;
  std::vector<PlannedKernel> kernels;  // in launch order; a stage's variants right after its kernel

  bool has(StageKind stage) const;
};

// The names of the planned projections' kernels, of their small specializations' and of the dequantized
// paths' two kernels (same StageKind as the planned projection).
inline constexpr std::string_view kQkvProjectionName = "qkv_projection";
inline constexpr std::string_view kOutputProjectionName = "output_projection";
inline constexpr std::string_view kQkvProjectionSmallName = "qkv_projection_small";
inline constexpr std::string_view kOutputProjectionSmallName = "output_projection_small";
inline constexpr std::string_view kQkvProjectionTinyName = "qkv_projection_tiny";
inline constexpr std::string_view kOutputProjectionTinyName = "output_projection_tiny";
inline constexpr std::string_view kQkvDequantizeName = "qkv_dequantize";
inline constexpr std::string_view kQkvProjectionDequantizedName = "qkv_projection_dequantized";
inline constexpr std::string_view kOutputDequantizeName = "output_dequantize";
inline constexpr std::string_view kOutputProjectionDequantizedName = "output_projection_dequantized";
inline constexpr std::string_view kQkvProjectionDequantizedSmallName = "qkv_projection_dequantized_small";
inline constexpr std::string_view kOutputProjectionDequantizedSmallName =
    "output_projection_dequantized_small";

// Which of a projection stage's kernels a planned kernel is.
enum class ProjectionVariant { planned, small, tiny, dequantize, dequantized, dequantized_small };
ProjectionVariant projection_variant_of(const PlannedKernel& kernel);

// A projection stage's kernel names, one per variant (the names above).
struct ProjectionKernelNames {
  std::string_view planned, small, tiny, dequantize, dequantized, dequantized_small;
  std::string_view of(ProjectionVariant variant) const;
};
inline constexpr ProjectionKernelNames kQkvProjectionNames{
    kQkvProjectionName, kQkvProjectionSmallName,       kQkvProjectionTinyName,
    kQkvDequantizeName, kQkvProjectionDequantizedName, kQkvProjectionDequantizedSmallName};
inline constexpr ProjectionKernelNames kOutputProjectionNames{
    kOutputProjectionName, kOutputProjectionSmallName,       kOutputProjectionTinyName,
    kOutputDequantizeName, kOutputProjectionDequantizedName, kOutputProjectionDequantizedSmallName};
// qkv_projection's or output_projection's names; Error for any other stage.
const ProjectionKernelNames& projection_kernel_names(StageKind stage);

// The kernels a launch of `variant` runs for projection stage `stage`, by name, in launch order (the
// dequantized path: its dequantize kernel, then its GEMM).
std::vector<std::string_view> projection_variant_kernels(StageKind stage, ProjectionVariant variant);

// Whether a launch of `num_tokens` rows runs the projection's dequantized path (planned, and
// num_tokens >= its min_tokens).
bool runs_dequantized(const std::optional<KernelPlan::Dequantized>& path, int num_tokens);

// The variant of projection stage `stage` (qkv_projection or output_projection) that a launch of
// `num_tokens` rows of N = n runs on `multiprocessors` SMs, as execute chooses: `dequantized` (its dequantize
// kernel, then its GEMM; `dequantized_small` where the path's small GEMM costs less by choose_gemm_variant)
// where runs_dequantized; else `small` where planned and choose_gemm_variant prefers
// it to the planned tiling, then `tiny` where planned and cheaper again by gemm_sm90_cost (ties keep the
// wider tiling); else `planned` (the fp8-activation GEMM included). Pure.
ProjectionVariant launched_projection_variant(const KernelPlan& kernels, StageKind stage, int num_tokens,
                                              int n, int multiprocessors);

// The q|k|v projection's GEMM spec that a launch of `num_tokens` rows runs (launched_projection_variant:
// the planned one, a short-launch specialization or the dequantized path's GEMM), or null for the
// fp8-activation GEMM (GemmFp8Spec). Pure.
const GemmSpec* launched_qkv_gemm(const KernelPlan& kernels, int num_tokens, int n, int multiprocessors);

// Whether a launch of `num_tokens` rows has its q|k|v postprocess done by the GEMM's epilogue (so runs no
// postprocess kernel, and the GEMM's output is already normed and rotated). Pure.
bool qkv_postprocess_fused(const KernelPlan& kernels, int num_tokens, int n, int multiprocessors);

// Which of the attention stage's kernels a launch runs: the planned one ("attention"), its short-launch
// specialization (kAttentionShortKernel) or its split-tail one (kAttentionSplitKernel).
enum class AttentionVariant { planned, short_launch, split };
inline constexpr std::size_t kAttentionVariants = 3;
// Each variant's kernel name in KernelPlan::kernels, indexed by the variant.
inline constexpr std::array<std::string_view, kAttentionVariants> kAttentionKernelNames = {
    kAttentionKernel, kAttentionShortKernel, kAttentionSplitKernel};
inline constexpr std::string_view attention_kernel_name(AttentionVariant variant) {
  return kAttentionKernelNames[static_cast<std::size_t>(variant)];
}
// The variant an attention-stage kernel name stands for (Error(internal) for any other name).
AttentionVariant attention_variant_named(std::string_view name);
// The variant's spec in `kernels` (Error(internal) for a variant the plan has not planned).
const AttentionSpec& attention_variant_spec(const KernelPlan& kernels, AttentionVariant variant);

// How execute launches the attention of a batch, from its host arrays: on the sm_90a kernel the walk's
// sequence order (longest_first_sequences; empty: none), then the short-launch specialization where planned
// and takes_short_launch says so, else the split-tail one where planned and choose_tail_split splits
// (`partial_units`: the workspace's, WorkspaceLayout::attention_partial_units), else the planned kernel.
// Pure: execute, the bench's kernel column and its trace read the same choice.
struct AttentionLaunch {
  AttentionVariant variant = AttentionVariant::planned;
  std::vector<int> order;
  TailSplit split;  // variant split only
};
AttentionLaunch launched_attention(const KernelPlan& kernels, std::span<const int> query_starts,
                                   std::span<const int> context_lens, std::span<const int> span_offsets,
                                   std::span<const int> span_bounds, int query_heads, int multiprocessors,
                                   int partial_units);

// What a plan may be asked for beyond its config (RuntimeOptions carries them to Runtime::compile).
struct PlanOptions {
  // The attention kernels with the trace compiled in (AttentionSpec::traces: `attnplan bench
  // --trace-attention`, docs/attention-trace.md); Error(config) unless the plan's attention is the sm_90a
  // kernel.
  bool trace_attention = false;
};

// Throws Error(config) when the config asks for something the kernels cannot do yet (a quantized
// projection format without a loader, fp8 activations on an arch without the fp8-activation GEMM or with
// q/k segments that are not 128-column multiples, a head dim the attention kernel does not support), one
// detail per problem naming the field, the arch and the rule.
KernelPlan plan_kernels(const config::AttentionConfig& config, const config::Arch& arch,
                        const PlanOptions& options = {});

// Elements of one row of the fused QKV buffer: Hq * D + Hkv * D + Hkv * Dv.
long long qkv_row_width(const config::AttentionConfig& config);

}  // namespace attnplan::plan
