// A compiled plan loaded on one device: modules loaded, functions resolved, shared-memory attributes
// set and the RoPE table uploaded once. execute() allocates nothing and never synchronizes with the host,
// so a host engine can capture it in a CUDA graph on its own stream.
#pragma once

#include <cuda.h>

#include <functional>
#include <memory>

#include "plan/batch.hpp"
#include "plan/compiled_plan.hpp"

namespace attnplan {
class Runtime;
}

namespace attnplan::plan {

// The caller's paged KV cache (NHD): K [num_blocks, block_size, kv_heads, head_dim] and
// V [num_blocks, block_size, kv_heads, value_head_dim]. Only the chunk's own slots are ever written.
// Elements are bf16, or with kv_cache.dtype fp8_e4m3 1-byte e4m3fn codes in the same layout (half the
// bytes): k_q = fp8(k / k_scale), read k = k_q * k_scale, likewise v (docs/config.md). The scales are
// run-time values because engines calibrate them per checkpoint (vLLM: self_attn.k_scale / v_scale); they
// must be finite and > 0 with an fp8 plan and are ignored otherwise.
struct KvCacheView {
  void* key_cache = nullptr;
  void* value_cache = nullptr;
  int num_blocks = 0;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// The layer's weights on the device, in HF layout (a projection weight is [out, in]), bf16 unless said
// otherwise. Null means absent; what the config requires must be present (checked before launching).
struct LayerWeightsView {
  const void* input_norm = nullptr;  // [hidden]
  const void* q_proj = nullptr;      // [Hq * D, hidden]       (projection.fused_qkv false)
  const void* k_proj = nullptr;      // [Hkv * D, hidden]
  const void* v_proj = nullptr;      // [Hkv * Dv, hidden]
  const void* qkv_proj = nullptr;    // [Hq * D + Hkv * D + Hkv * Dv, hidden]   (fused_qkv true)
  const void* q_bias = nullptr;      // [Hq * D]      (qkv_bias; with fused_qkv, qkv_bias holds all three)
  const void* k_bias = nullptr;      // [Hkv * D]
  const void* v_bias = nullptr;      // [Hkv * Dv]
  const void* qkv_bias = nullptr;    // [Hq * D + Hkv * D + Hkv * Dv]
  const void* q_norm = nullptr;      // [D]  (qkv_norm.query)
  const void* k_norm = nullptr;      // [D]  (qkv_norm.key)
  const void* o_proj = nullptr;      // [hidden, Hq * Dv]
  const void* o_bias = nullptr;      // [hidden] (output_bias)
  const float* sinks = nullptr;      // [Hq] fp32 sink logits (sinks)
  // Quantized projections (projection.qkv / .output not bf16; formats the GEMM has a policy for): the
  // *_proj pointers above hold the packed bytes as the checkpoint stores them, these the scale tensors
  // (fp8: f32, 4-byte aligned; mxfp8 / mxfp4: E8M0 bytes; nvfp4: e4m3 bytes) and nvfp4's f32 scale_2.
  const void* q_scales = nullptr;
  const void* k_scales = nullptr;
  const void* v_scales = nullptr;
  const void* o_scales = nullptr;
  const float* q_scale_2 = nullptr;
  const float* k_scale_2 = nullptr;
  const float* v_scale_2 = nullptr;
  const float* o_scale_2 = nullptr;
  // packed_integer: qzeros as stored (i32) and, with act_order, g_idx (i32 [hidden or Hq * Dv]); affine:
  // the biases. packed_integer and affine scales and biases are f32 here (GemmSegment).
  const void* q_zeros = nullptr;
  const void* k_zeros = nullptr;
  const void* v_zeros = nullptr;
  const void* o_zeros = nullptr;
  const int* q_g_idx = nullptr;
  const int* k_g_idx = nullptr;
  const int* v_g_idx = nullptr;
  const int* o_g_idx = nullptr;
};

// The attention counters' bytes in a workspace (WorkspaceLayout::attention_items): the item counter and
// one part counter per split item (a split item has at least two parts).
inline constexpr std::size_t kAttentionCounterBytes = 512;
static_assert(4 * (1 + kMaxTailSplitUnits / 2) <= kAttentionCounterBytes);

// Where the intermediates live inside the caller's workspace (bf16 but the fp8 codes), for a given token
// count.
struct WorkspaceLayout {
  std::size_t normed = 0;     // byte offset of [T, hidden]
  std::size_t qkv = 0;        // byte offset of [T, qkv_row_width]: q | k | v rows
  std::size_t attention = 0;  // byte offset of [T, Hq * Dv]
  // fp8 activations only: byte offset of the quantized input of the projection being run (e4m3 codes
  // [T, K] + f32 scales, fp8_activation_buffers), sized for the larger K; both projections reuse it, one
  // after the other on the stream. fp8_activation_bytes is 0 without fp8 activations.
  std::size_t fp8_activations = 0;
  std::size_t fp8_activation_bytes = 0;
  // Dequantized path (KernelPlan::*_dequantized, launches of at least dequantized_min_tokens): byte offset
  // of W [N, K] bf16 of the projection being run, sized for the larger; both projections reuse it, one
  // after the other on the stream. dequantized_weight_bytes is 0 when this launch does not take the path.
  std::size_t dequantized_weights = 0;
  std::size_t dequantized_weight_bytes = 0;
  // A plan whose q|k|v GEMM can apply RoPE in its epilogue (RmsNormSpec::rotary_pairs > 0): byte offset of
  // the rotation table [T, rotation_stride] f32 that the input norm writes and that GEMM reads, in the
  // attention output's region (sized for the larger of the two; attention overwrites the table after the
  // GEMM has read it). rotation_stride is 0 without it.
  std::size_t rotations = 0;
  int rotation_stride = 0;
  // Plans whose sm_90a attention can split its tail (choose_tail_split: bidirectional spans, head_dim <=
  // 128): byte offset of the parts' partials (AttentionParams::split_partials), kMaxTailSplitUnits of
  // attention_sm90_split_unit_floats each (8.8 MB at D 64's three warpgroups, 11 MB at D 128). 0 bytes
  // otherwise.
  std::size_t attention_partials = 0;
  std::size_t attention_partials_bytes = 0;
  int attention_partial_units = 0;  // the parts those bytes hold (choose_tail_split's max_units)
  // Byte offset of the attention kernel's work-item counter (AttentionParams::item_counter), then its split
  // tail's part counters (split_counters: at most kMaxTailSplitUnits / 2 items), all zeroed by the KV store
  // kernel before each attention launch whose kernel claims its items; kAttentionCounterBytes kept.
  std::size_t attention_items = 0;
  // A plan whose attention traces (AttentionSpec::traces): byte offset of its records
  // (AttentionParams::trace), kAttentionTraceBytes of them, written by every attention launch. 0 bytes
  // otherwise.
  std::size_t attention_trace = 0;
  std::size_t attention_trace_bytes = 0;
  std::size_t bytes = 0;  // total
  long long qkv_row_width = 0;
};

// The layout for `num_tokens` tokens of a plan of `config` (pure; PrefillPlan::workspace_layout adds the
// check of num_tokens against max_tokens).
WorkspaceLayout plan_workspace(const config::AttentionConfig& config, const KernelPlan& kernels,
                               int num_tokens);

struct ExecuteArgs {
  const void* input = nullptr;  // [num_tokens, hidden] bf16
  void* output = nullptr;       // [num_tokens, hidden] bf16 (the attention output after o_proj, no residual)
  LayerWeightsView weights;
  KvCacheView cache;
  BatchDescription batch;
  void* workspace = nullptr;  // at least workspace_bytes(batch.num_tokens) bytes, 256-byte aligned
  std::size_t workspace_bytes = 0;
};

// Called after each stage is enqueued (for `attnplan verify` and --dump-stages): may synchronize the
// stream and read the workspace. Never used on the hot path.
using StageObserver = std::function<void(StageKind stage, const WorkspaceLayout& layout)>;

// What an observer does. `workspace`: it reads the stages' results, so the plan writes each where the
// layout says even when the next stage reads another form (the normed bf16 rows beside the fp8 codes the
// q|k|v projection reads). `timing`: it only records events, and the stages run exactly as unobserved.
enum class Observation { workspace, timing };

// Stage entry points for engines that run a stage on its own, and for tests.
struct InputNormArgs {
  const void* input = nullptr;   // [num_tokens, hidden_size]
  const void* weight = nullptr;  // [hidden_size]
  void* output = nullptr;        // [num_tokens, hidden_size]
  int num_tokens = 0;
};

struct KvStoreArgs {
  const void* key = nullptr;       // [num_tokens, kv_heads, head_dim] rows, key_row_stride elements apart
  const void* value = nullptr;     // [num_tokens, kv_heads, value_head_dim] rows
  long long key_row_stride = 0;    // 0: kv_heads * head_dim (dense)
  long long value_row_stride = 0;  // 0: kv_heads * value_head_dim (dense)
  KvCacheView cache;
  BatchDescription batch;  // only the device arrays and the counts are used
};

class PrefillPlan {
 public:
  PrefillPlan(PrefillPlan&&) noexcept;
  PrefillPlan& operator=(PrefillPlan&&) noexcept;
  ~PrefillPlan();

  const CompiledPlan& compiled() const { return compiled_; }

  // Scratch bytes execute() needs for `num_tokens` tokens (at most max_tokens), and where each
  // intermediate goes.
  std::size_t workspace_bytes(int num_tokens) const { return workspace_layout(num_tokens).bytes; }
  WorkspaceLayout workspace_layout(int num_tokens) const;

  // The whole layer (spec sections 1-7) for one chunk. Checks every argument and the whole batch against
  // the plan first (Error(input) naming the field; nothing is launched then), then enqueues the stages
  // on `stream`.
  void execute(const ExecuteArgs& args, CUstream stream, const StageObserver& observer = {},
               Observation observation = Observation::workspace) const;

  void launch_input_norm(const InputNormArgs& args, CUstream stream) const;
  void launch_kv_store(const KvStoreArgs& args, CUstream stream) const;

  // The kernels (PlannedKernel names, in launch order) that execute runs for `stage` on a chunk of
  // `num_tokens` tokens: for a projection the planned GEMM, its small specialization or the dequantized
  // path's two kernels (launched_projection_variant on this device's SMs); the stage's one kernel otherwise.
  std::vector<std::string> stage_kernels(StageKind stage, int num_tokens) const;

  // Which attention kernel execute launches for `batch` (launched_attention on this device's SMs: the
  // planned one, its short-launch or its split-tail specialization); its name is attention_kernel_name's,
  // its spec attention_variant_spec's. stage_kernels cannot tell without the batch.
  AttentionVariant attention_variant(const BatchDescription& batch) const;

  // Whether a chunk of `num_tokens` tokens has its q/k/v norms and RoPE done by the q|k|v GEMM's epilogue
  // (qkv_postprocess_fused on this device's SMs): then execute runs no qkv_postprocess stage, and what an
  // observer reads at qkv_projection is already normed and rotated.
  bool qkv_postprocess_fused(int num_tokens) const;

 private:
  friend class ::attnplan::Runtime;
  struct Loaded;
  PrefillPlan(CompiledPlan compiled, std::unique_ptr<Loaded> loaded);
  void check_weights(const LayerWeightsView& weights) const;
  // Fill the stage's Params and launch it; execute() and the launch_* entry points share them. The
  // arguments are already checked, the context is current, and `args` strides are resolved (non-zero).
  // With `codes` (a plan whose norm writes fp8 codes) also the q|k|v projection's e4m3 input; args.output
  // may then be null.
  // With `rotations` (a launch whose q|k|v GEMM applies RoPE in its epilogue) also each token's row of
  // the rotation table there, the positions from `batch`.
  void enqueue_input_norm(const InputNormArgs& args, CUstream stream,
                          const Fp8ActivationBuffers* codes = nullptr, float* rotations = nullptr,
                          const BatchDescription* batch = nullptr) const;
  // With `attention_items` the store's kernel also zeroes that counter for the attention launch after it.
  void enqueue_kv_store(const KvStoreArgs& args, CUstream stream, int* attention_items = nullptr,
                        int attention_counters = 1) const;
  CompiledPlan compiled_;
  std::unique_ptr<Loaded> loaded_;
};

}  // namespace attnplan::plan
