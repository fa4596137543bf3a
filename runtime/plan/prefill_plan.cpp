#include "plan/prefill_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>

#include "attnplan/attention_params.h"
#include "attnplan/gemm_params.h"
#include "attnplan/params.h"
#include "attnplan/qkv_postprocess_params.h"
#include "core/error.hpp"
#include "driver/context.hpp"
#include "driver/device.hpp"
#include "driver/launch.hpp"
#include "driver/memory.hpp"
#include "driver/module.hpp"
#include "plan/rope_table.hpp"
#include "plan/runtime.hpp"

namespace attnplan::plan {

struct PrefillPlan::Loaded {
  explicit Loaded(driver::Context device_context) : context(std::move(device_context)) {}

  driver::Context context;
  std::vector<driver::Module> modules;  // own the functions below
  driver::Function input_norm, qkv_projection, qkv_postprocess, kv_store, output_projection;
  // The attention stage's kernels, indexed by AttentionVariant: the planned one, and its short-launch and
  // split-tail specializations where planned (KernelPlan::attention_short, attention_split).
  std::array<driver::Function, kAttentionVariants> attention;
  driver::Function& attention_kernel(AttentionVariant variant) {
    return attention[static_cast<std::size_t>(variant)];
  }
  const driver::Function& attention_kernel(AttentionVariant variant) const {
    return attention[static_cast<std::size_t>(variant)];
  }
  // The short-launch specializations, where planned (KernelPlan::qkv_projection_small, ..._tiny).
  driver::Function qkv_projection_small, output_projection_small, qkv_projection_tiny, output_projection_tiny;
  // The dequantized paths, where planned (KernelPlan::qkv_projection_dequantized, ...).
  driver::Function qkv_dequantize, qkv_projection_dequantized, output_dequantize,
      output_projection_dequantized;
  driver::Function qkv_projection_dequantized_small, output_projection_dequantized_small;
  driver::DeviceBuffer rope_frequencies;  // [rotary_dim / 2] doubles, uploaded once at load
  double rope_attention_factor = 1.0;
  int multiprocessors = 0;           // the device's SMs: the persistent grids of the wgmma GEMM and attention
  driver::Function output_quantize;  // fp8 activations on the output projection only
};

namespace {

// The projection's function and spec for this launch's M: the planned one, or a short-launch
// specialization where launched_projection_variant says so (a dequantized launch checks the planned spec
// first).
std::pair<const driver::Function*, const GemmSpec*> projection_variant(
    const KernelPlan& kernels, StageKind stage, const driver::Function& planned_function,
    const driver::Function& small_function, const driver::Function& tiny_function, const GemmParams& params,
    int multiprocessors) {
  const bool qkv = stage == StageKind::qkv_projection;
  switch (launched_projection_variant(kernels, stage, params.m, params.n, multiprocessors)) {
    case ProjectionVariant::small:
      return {&small_function, &*(qkv ? kernels.qkv_projection_small : kernels.output_projection_small)};
    case ProjectionVariant::tiny:
      return {&tiny_function, &*(qkv ? kernels.qkv_projection_tiny : kernels.output_projection_tiny)};
    default:
      return {&planned_function, qkv ? &kernels.qkv_projection : &kernels.output_projection};
  }
}

void require(bool condition, const std::string& message) {
  if (!condition) throw Error(Stage::input, message);
}

void require_pointer(const void* pointer, const std::string& field, std::size_t alignment) {
  require(pointer != nullptr, fmt::format("{}: null device pointer", field));
  require(reinterpret_cast<std::uintptr_t>(pointer) % alignment == 0,
          fmt::format("{}: device pointer {} is not aligned to {} bytes", field, pointer, alignment));
}

// An fp8 plan divides by the cache's scales; a bf16 plan never reads them.
void require_kv_scales(const KvCacheView& cache, bool fp8) {
  if (!fp8) return;
  for (const auto& [field, scale] :
       {std::pair{"cache.k_scale", cache.k_scale}, std::pair{"cache.v_scale", cache.v_scale}}) {
    require(std::isfinite(scale) && scale > 0.0f,
            fmt::format("{}: {} must be finite and > 0 (the plan's KV cache is fp8_e4m3)", field, scale));
  }
}

void require_absent(const void* pointer, const std::string& field, const std::string& why) {
  require(pointer == nullptr, fmt::format("{}: given, but {}", field, why));
}

// The projection's GEMM (fp8 activations: the e4m3 one) checks its Params.
void check_projection(const GemmSpec& spec, const std::optional<GemmFp8Spec>& fp8, const GemmParams& params) {
  if (fp8)
    fp8->check(params);
  else
    spec.check(params);
}

int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

std::size_t align_up(std::size_t value, std::size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

template <class T>
T* at(void* base, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

// One launch's dequantized path: the dequantize kernel's Params and the bf16 GEMM's (segments pointing
// into W in the workspace), and which of the path's GEMMs runs (`small`: gemm_small).
struct Dequantized {
  const KernelPlan::Dequantized* path;
  DequantizeParams dequantize;
  GemmParams gemm;
  bool small = false;
  const GemmSpec& gemm_spec() const { return small ? *path->gemm_small : path->gemm; }
};

// The dequantized path's Params for `params` (the quantized projection's, already checked), checked, when
// this launch takes it.
std::optional<Dequantized> dequantized_launch(const KernelPlan& kernels, StageKind stage,
                                              const GemmParams& params, const WorkspaceLayout& layout,
                                              void* workspace, int multiprocessors) {
  const std::optional<KernelPlan::Dequantized>& path = stage == StageKind::qkv_projection
                                                           ? kernels.qkv_projection_dequantized
                                                           : kernels.output_projection_dequantized;
  if (!runs_dequantized(path, params.m)) return std::nullopt;
  bf16_bits* weight = at<bf16_bits>(workspace, layout.dequantized_weights);
  const bool small = launched_projection_variant(kernels, stage, params.m, params.n, multiprocessors) ==
                     ProjectionVariant::dequantized_small;
  const Dequantized launch{&*path, DequantizeParams{params, weight}, dequantized_gemm_params(params, weight),
                           small};
  path->dequantize.check(launch.dequantize);
  launch.gemm_spec().check(launch.gemm);
  return launch;
}

}  // namespace

PrefillPlan::PrefillPlan(CompiledPlan compiled, std::unique_ptr<Loaded> loaded)
    : compiled_(std::move(compiled)), loaded_(std::move(loaded)) {}
PrefillPlan::PrefillPlan(PrefillPlan&&) noexcept = default;
PrefillPlan& PrefillPlan::operator=(PrefillPlan&&) noexcept = default;
PrefillPlan::~PrefillPlan() = default;

WorkspaceLayout plan_workspace(const config::AttentionConfig& config, const KernelPlan& kernels,
                               int num_tokens) {
  // 256-byte aligned regions: every kernel's 16-byte vector accesses stay aligned whatever the widths.
  WorkspaceLayout layout;
  layout.qkv_row_width = qkv_row_width(config);
  const std::size_t tokens = static_cast<std::size_t>(std::max(num_tokens, 0));
  const int attention_width = config.query_heads * config.value_head_dim;
  layout.normed = 0;
  layout.qkv = align_up(layout.normed + tokens * config.hidden_size * 2, 256);
  layout.attention = align_up(layout.qkv + tokens * layout.qkv_row_width * 2, 256);
  std::size_t attention_bytes = tokens * attention_width * 2;
  if (kernels.input_norm.rotary_pairs > 0) {
    layout.rotations = layout.attention;
    layout.rotation_stride = rope_rotation_stride(2 * kernels.input_norm.rotary_pairs);
    attention_bytes = std::max(attention_bytes, tokens * layout.rotation_stride * 4);
  }
  layout.fp8_activations = align_up(layout.attention + attention_bytes, 256);
  if (kernels.qkv_projection_fp8)
    layout.fp8_activation_bytes = fp8_activation_bytes(int(tokens), config.hidden_size);
  if (kernels.output_projection_fp8) {
    layout.fp8_activation_bytes =
        std::max(layout.fp8_activation_bytes, fp8_activation_bytes(int(tokens), attention_width));
  }
  layout.dequantized_weights = align_up(layout.fp8_activations + layout.fp8_activation_bytes, 256);
  if (runs_dequantized(kernels.qkv_projection_dequantized, num_tokens))
    layout.dequantized_weight_bytes = std::size_t(layout.qkv_row_width) * config.hidden_size * 2;
  if (runs_dequantized(kernels.output_projection_dequantized, num_tokens)) {
    layout.dequantized_weight_bytes =
        std::max(layout.dequantized_weight_bytes, std::size_t(config.hidden_size) * attention_width * 2);
  }
  layout.attention_partials = align_up(layout.dequantized_weights + layout.dequantized_weight_bytes, 256);
  if (const std::optional<AttentionSpec>& split = kernels.attention_split) {
    layout.attention_partial_units = kMaxTailSplitUnits;
    layout.attention_partials_bytes =
        std::size_t(kMaxTailSplitUnits) * 4 *
        attention_sm90_split_unit_floats(split->head_dim, split->tiling.block_m);
  }
  layout.attention_items = align_up(layout.attention_partials + layout.attention_partials_bytes, 256);
  layout.attention_trace = layout.attention_items + kAttentionCounterBytes;  // 256-byte multiple
  if (kernels.attention.traces) layout.attention_trace_bytes = kAttentionTraceBytes;
  layout.bytes = layout.attention_trace + layout.attention_trace_bytes;
  return layout;
}

WorkspaceLayout PrefillPlan::workspace_layout(int num_tokens) const {
  const config::AttentionConfig& config = compiled_.config;
  require(num_tokens >= 0 && num_tokens <= config.max_tokens,
          fmt::format("num_tokens: {} is outside [0, max_tokens = {}]", num_tokens, config.max_tokens));
  return plan_workspace(config, compiled_.kernels_planned, num_tokens);
}

void PrefillPlan::check_weights(const LayerWeightsView& w) const {
  const config::AttentionConfig& config = compiled_.config;
  require_pointer(w.input_norm, "weights.input_norm", 16);
  if (config.projection.fused_qkv) {
    require_pointer(w.qkv_proj, "weights.qkv_proj", 16);
    for (auto [pointer, name] : {std::pair{w.q_proj, "weights.q_proj"},
                                 {w.k_proj, "weights.k_proj"},
                                 {w.v_proj, "weights.v_proj"},
                                 {w.q_bias, "weights.q_bias"},
                                 {w.k_bias, "weights.k_bias"},
                                 {w.v_bias, "weights.v_bias"}}) {
      require_absent(pointer, name, "projection.fused_qkv is true (use qkv_proj / qkv_bias)");
    }
    if (config.qkv_bias)
      require_pointer(w.qkv_bias, "weights.qkv_bias", 16);
    else
      require_absent(w.qkv_bias, "weights.qkv_bias", "qkv_bias is false");
  } else {
    require_pointer(w.q_proj, "weights.q_proj", 16);
    require_pointer(w.k_proj, "weights.k_proj", 16);
    require_pointer(w.v_proj, "weights.v_proj", 16);
    require_absent(w.qkv_proj, "weights.qkv_proj", "projection.fused_qkv is false");
    require_absent(w.qkv_bias, "weights.qkv_bias", "projection.fused_qkv is false");
    for (auto [pointer, name] : {std::pair{w.q_bias, "weights.q_bias"},
                                 {w.k_bias, "weights.k_bias"},
                                 {w.v_bias, "weights.v_bias"}}) {
      if (config.qkv_bias)
        require_pointer(pointer, name, 16);
      else
        require_absent(pointer, name, "qkv_bias is false");
    }
  }
  if (config.qkv_norm.query)
    require_pointer(w.q_norm, "weights.q_norm", 16);
  else
    require_absent(w.q_norm, "weights.q_norm", "qkv_norm.query is false");
  if (config.qkv_norm.key)
    require_pointer(w.k_norm, "weights.k_norm", 16);
  else
    require_absent(w.k_norm, "weights.k_norm", "qkv_norm.key is false");
  require_pointer(w.o_proj, "weights.o_proj", 16);
  if (config.output_bias)
    require_pointer(w.o_bias, "weights.o_bias", 16);
  else
    require_absent(w.o_bias, "weights.o_bias", "output_bias is false");
  if (config.sinks)
    require_pointer(w.sinks, "weights.sinks", 4);
  else
    require_absent(w.sinks, "weights.sinks", "sinks is false");
}

void PrefillPlan::execute(const ExecuteArgs& args, CUstream stream, const StageObserver& observer,
                          Observation observation) const {
  const config::AttentionConfig& config = compiled_.config;
  const KernelPlan& kernels = compiled_.kernels_planned;
  const BatchDescription& batch = args.batch;
  const int tokens = batch.num_tokens;

  // Every check before the first launch: a rejected call changes nothing, the KV cache included.
  validate_batch(batch, BatchLimits{config.max_tokens, config.kv_cache.block_size, args.cache.num_blocks,
                                    config.bidirectional_spans});
  if (tokens == 0) return;
  check_weights(args.weights);
  require_pointer(args.input, "input", 16);
  require_pointer(args.output, "output", 16);
  require_pointer(args.cache.key_cache, "cache.key_cache", 16);
  require_pointer(args.cache.value_cache, "cache.value_cache", 16);
  require_kv_scales(args.cache, kernels.kv_store.fp8_cache);
  const WorkspaceLayout layout = workspace_layout(tokens);
  require_pointer(args.workspace, "workspace", 256);
  require(
      args.workspace_bytes >= layout.bytes,
      fmt::format("workspace_bytes: {} bytes is less than the {} bytes {} tokens need (workspace_bytes())",
                  args.workspace_bytes, layout.bytes, tokens));

  const int hidden = config.hidden_size;
  const long long q_width = static_cast<long long>(config.query_heads) * config.head_dim;
  const long long k_width = static_cast<long long>(config.kv_heads) * config.head_dim;
  const int attention_width = config.query_heads * config.value_head_dim;
  bf16_bits* normed = at<bf16_bits>(args.workspace, layout.normed);
  bf16_bits* qkv = at<bf16_bits>(args.workspace, layout.qkv);
  bf16_bits* attention_out = at<bf16_bits>(args.workspace, layout.attention);
  const LayerWeightsView& w = args.weights;

  // Params of every stage, filled and checked before anything is enqueued (the input norm's and the KV
  // store's need no check beyond the arguments': enqueue_* fills them).
  const InputNormArgs norm{args.input, w.input_norm, normed, tokens};

  GemmParams projection{};
  projection.a = normed;
  projection.c = qkv;
  projection.lda = hidden;
  projection.ldc = layout.qkv_row_width;
  projection.m = tokens;
  projection.n = static_cast<int>(layout.qkv_row_width);
  projection.k = hidden;
  if (config.projection.fused_qkv) {
    projection.segments[0] = {static_cast<const bf16_bits*>(w.qkv_proj),
                              static_cast<const bf16_bits*>(w.qkv_bias), 0, projection.n};
  } else {
    projection.segments[0] = {static_cast<const bf16_bits*>(w.q_proj),
                              static_cast<const bf16_bits*>(w.q_bias), 0, static_cast<int>(q_width)};
    projection.segments[1] = {static_cast<const bf16_bits*>(w.k_proj),
                              static_cast<const bf16_bits*>(w.k_bias), static_cast<int>(q_width),
                              static_cast<int>(q_width + k_width)};
    projection.segments[2] = {static_cast<const bf16_bits*>(w.v_proj),
                              static_cast<const bf16_bits*>(w.v_bias), static_cast<int>(q_width + k_width),
                              projection.n};
    // Quantized q/k/v: each segment's scales (null for bf16; GemmSpec::check demands them otherwise).
    projection.segments[0].scales = w.q_scales;
    projection.segments[1].scales = w.k_scales;
    projection.segments[2].scales = w.v_scales;
    projection.segments[0].scale_2 = w.q_scale_2;
    projection.segments[1].scale_2 = w.k_scale_2;
    projection.segments[2].scale_2 = w.v_scale_2;
    projection.segments[0].zeros = w.q_zeros;
    projection.segments[1].zeros = w.k_zeros;
    projection.segments[2].zeros = w.v_zeros;
    projection.segments[0].g_idx = w.q_g_idx;
    projection.segments[1].g_idx = w.k_g_idx;
    projection.segments[2].g_idx = w.v_g_idx;
  }
  const Loaded& loaded = *loaded_;
  const auto [qkv_function, qkv_spec] = projection_variant(
      kernels, StageKind::qkv_projection, loaded.qkv_projection, loaded.qkv_projection_small,
      loaded.qkv_projection_tiny, projection, loaded.multiprocessors);
  check_projection(*qkv_spec, kernels.qkv_projection_fp8, projection);
  const std::optional<Dequantized> qkv_dequantized = dequantized_launch(
      kernels, StageKind::qkv_projection, projection, layout, args.workspace, loaded.multiprocessors);

  // The q/k/v norms and RoPE: in the q|k|v GEMM's epilogue where the launched GEMM takes them (its
  // rotation table from the input norm), else the postprocess kernel after it.
  const bool fused_postprocess =
      plan::qkv_postprocess_fused(kernels, tokens, projection.n, loaded.multiprocessors);
  float* rotations =
      fused_postprocess && layout.rotation_stride > 0 ? at<float>(args.workspace, layout.rotations) : nullptr;
  GemmQkvEpilogueParams qkv_epilogue{};
  qkv_epilogue.rotations = rotations;
  qkv_epilogue.q_norm_weight = static_cast<const bf16_bits*>(w.q_norm);
  qkv_epilogue.k_norm_weight = static_cast<const bf16_bits*>(w.k_norm);
  qkv_epilogue.rotation_stride = layout.rotation_stride;
  qkv_epilogue.epsilon = static_cast<float>(config.qkv_norm_epsilon());

  QkvPostprocessParams post{};
  post.qkv = qkv;
  post.q_norm_weight = static_cast<const bf16_bits*>(w.q_norm);
  post.k_norm_weight = static_cast<const bf16_bits*>(w.k_norm);
  post.frequencies = loaded_->rope_frequencies.data<const double>();
  post.query_starts = batch.query_starts;
  post.context_lens = batch.context_lens;
  post.qkv_row_stride = layout.qkv_row_width;
  post.num_tokens = tokens;
  post.num_seqs = batch.num_seqs;
  post.epsilon = static_cast<float>(config.qkv_norm_epsilon());
  post.attention_factor = static_cast<float>(loaded_->rope_attention_factor);

  const KvStoreArgs store{
      qkv + q_width, qkv + q_width + k_width, layout.qkv_row_width, layout.qkv_row_width, args.cache, batch};

  AttentionParams attend{};
  attend.query = qkv;
  attend.key_cache = static_cast<bf16_bits*>(args.cache.key_cache);
  attend.value_cache = static_cast<bf16_bits*>(args.cache.value_cache);
  attend.output = attention_out;
  attend.query_starts = batch.query_starts;
  attend.context_lens = batch.context_lens;
  attend.block_tables = batch.block_tables;
  attend.span_offsets = batch.span_offsets;
  attend.span_bounds = batch.span_bounds;
  attend.sinks = w.sinks;
  if (kernels.attention.dynamic_items())
    attend.item_counter = at<int>(args.workspace, layout.attention_items);
  if (kernels.attention.traces) attend.trace = at<unsigned long long>(args.workspace, layout.attention_trace);
  attend.query_row_stride = layout.qkv_row_width;
  attend.output_row_stride = attention_width;
  attend.scale =
      static_cast<float>(config.attention_scale.value_or(1.0 / std::sqrt(double(config.head_dim))));
  attend.softcap = static_cast<float>(config.softcap.value_or(0.0));
  attend.window = config.sliding_window.value_or(0);
  attend.num_seqs = batch.num_seqs;
  attend.max_query_len = batch.max_query_len;
  attend.kv_heads = config.kv_heads;
  attend.max_blocks_per_seq = batch.max_blocks_per_seq;
  attend.num_blocks = args.cache.num_blocks;
  attend.k_scale = args.cache.k_scale;
  attend.v_scale = args.cache.v_scale;
  // The planned attention kernel, its short-launch specialization or its split-tail one
  // (launched_attention).
  const AttentionLaunch launch = launched_attention(
      kernels, batch.host_query_starts, batch.host_context_lens, batch.host_span_offsets,
      batch.host_span_bounds, config.query_heads, loaded.multiprocessors, layout.attention_partial_units);
  const AttentionSpec& attention_spec = attention_variant_spec(kernels, launch.variant);
  const driver::Function& attention_function = loaded.attention_kernel(launch.variant);
  if (kernels.attention.kernel == AttentionKernel::wgmma_sm90) {  // the heaviest items first
    set_item_order(attend, launch.order);
    // Non-causal prompts: no span walk at each item's start. An order means every chunk is one span
    // (longest_first_sequences found it); without one, more sequences than it orders may still be.
    attend.whole_chunk_spans =
        kernels.attention.has_spans &&
        (!launch.order.empty() || every_chunk_one_span(batch.host_query_starts, batch.host_context_lens,
                                                       batch.host_span_offsets, batch.host_span_bounds));
    if (launch.variant == AttentionVariant::split) {
      attend.split_items = launch.split.items;
      attend.split_parts = launch.split.parts;
      attend.split_partials = at<float>(args.workspace, layout.attention_partials);
      attend.split_counters = attend.item_counter + 1;  // zeroed with it
    }
  }
  // A plan built for spans reads span_offsets on the device: a batch without spans passes an all-zero
  // [num_seqs + 1] table (validate_batch has checked its host copy).
  require(!kernels.attention.has_spans || batch.span_offsets != nullptr,
          "span_offsets: this plan has bidirectional_spans; pass span_offsets (all zeros for a batch without "
          "spans)");
  attention_spec.check(attend, config.query_heads);

  GemmParams output{};
  output.a = attention_out;
  output.c = static_cast<bf16_bits*>(args.output);
  output.lda = attention_width;
  output.ldc = hidden;
  output.m = tokens;
  output.n = hidden;
  output.k = attention_width;
  output.segments[0] = {static_cast<const bf16_bits*>(w.o_proj), static_cast<const bf16_bits*>(w.o_bias), 0,
                        hidden};
  output.segments[0].scales = w.o_scales;
  output.segments[0].scale_2 = w.o_scale_2;
  output.segments[0].zeros = w.o_zeros;
  output.segments[0].g_idx = w.o_g_idx;
  const auto [output_function, output_spec] = projection_variant(
      kernels, StageKind::output_projection, loaded.output_projection, loaded.output_projection_small,
      loaded.output_projection_tiny, output, loaded.multiprocessors);
  check_projection(*output_spec, kernels.output_projection_fp8, output);
  const std::optional<Dequantized> output_dequantized = dequantized_launch(
      kernels, StageKind::output_projection, output, layout, args.workspace, loaded.multiprocessors);

  // Enqueue in spec order. The observer (debugging only) sees each stage's results in the workspace.
  loaded.context.make_current();
  auto notify = [&](StageKind stage) {
    if (observer) observer(stage, layout);
  };
  // With fp8 codes from the norm (RmsNormSpec::fp8_codes) the q|k|v projection's quantized input is
  // written here; the bf16 rows only for an observer that reads them (the GEMM reads the codes).
  if (kernels.input_norm.fp8_codes.has_value()) {
    const Fp8ActivationBuffers buffers =
        fp8_activation_buffers(at<void>(args.workspace, layout.fp8_activations), tokens, hidden);
    check_fp8_activation_buffers(projection, buffers);
    InputNormArgs quantizing = norm;
    if (!observer || observation == Observation::timing) quantizing.output = nullptr;
    enqueue_input_norm(quantizing, stream, &buffers, rotations, &batch);
  } else {
    enqueue_input_norm(norm, stream, nullptr, rotations, &batch);
  }
  notify(StageKind::input_norm);
  // A projection with fp8 activations: the quantizer into the workspace (its own stage; `quantize` null:
  // the codes are there already, from the input norm), then the e4m3 GEMM over the codes. A long launch of a
  // weight-only quantized one: W dequantized into the workspace, then the bf16 GEMM. Otherwise the GEMM
  // variant chosen for this launch's M.
  auto project = [&](const driver::Function* quantize, StageKind stage, const driver::Function& gemm,
                     const GemmSpec& spec, const std::optional<GemmFp8Spec>& fp8, const GemmParams& params,
                     const std::optional<Dequantized>& dequantized, const driver::Function& dequantize,
                     const driver::Function& dequantized_gemm,
                     const driver::Function& dequantized_small_gemm) {
    // The q|k|v GEMM's fused postprocess reads these where its spec has one (GemmSpec::postprocess,
    // GemmFp8Spec::postprocess).
    const GemmQkvEpilogueParams* epilogue = stage == StageKind::qkv_projection ? &qkv_epilogue : nullptr;
    if (dequantized) {
      launch_dequantize(dequantize, dequantized->path->dequantize, dequantized->dequantize, stream);
      launch_gemm(dequantized->small ? dequantized_small_gemm : dequantized_gemm, dequantized->gemm_spec(),
                  dequantized->gemm, stream, loaded.multiprocessors, epilogue);
    } else if (fp8) {
      const Fp8ActivationBuffers buffers =
          fp8_activation_buffers(at<void>(args.workspace, layout.fp8_activations), params.m, params.k);
      if (quantize != nullptr) {
        launch_fp8_quantize(*quantize, kernels.activation_quantize, params, buffers, stream);
        notify(StageKind::output_quantize);
      }
      launch_gemm_fp8_codes(gemm, *fp8, params, buffers, stream, loaded.multiprocessors, epilogue);
    } else {
      launch_gemm(gemm, spec, params, stream, loaded.multiprocessors, epilogue);
    }
    notify(stage);
  };
  project(nullptr, StageKind::qkv_projection, *qkv_function, *qkv_spec, kernels.qkv_projection_fp8,
          projection, qkv_dequantized, loaded.qkv_dequantize, loaded.qkv_projection_dequantized,
          loaded.qkv_projection_dequantized_small);
  if (kernels.has(StageKind::qkv_postprocess) && !fused_postprocess) {
    driver::launch(loaded.qkv_postprocess,
                   driver::LaunchShape{
                       {unsigned(tokens), 1, 1}, {unsigned(kernels.qkv_postprocess.tiling.threads), 1, 1}, 0},
                   stream, post);
    notify(StageKind::qkv_postprocess);
  }
  // which zeroes the item counter and the part counters for the attention launch
  enqueue_kv_store(store, stream, attend.item_counter, 1 + attend.split_items);
  notify(StageKind::kv_store);
  launch_attention(attention_function, attention_spec, attend, config.query_heads, stream,
                   loaded.multiprocessors);
  notify(StageKind::attention);
  project(&loaded.output_quantize, StageKind::output_projection, *output_function, *output_spec,
          kernels.output_projection_fp8, output, output_dequantized, loaded.output_dequantize,
          loaded.output_projection_dequantized, loaded.output_projection_dequantized_small);
}

std::vector<std::string> PrefillPlan::stage_kernels(StageKind stage, int num_tokens) const {
  const bool qkv = stage == StageKind::qkv_projection;
  if (!qkv && stage != StageKind::output_projection) return {compiled_.kernel(stage).name};
  const int n = int(qkv ? qkv_row_width(compiled_.config) : compiled_.config.hidden_size);
  const ProjectionVariant variant =
      launched_projection_variant(compiled_.kernels_planned, stage, num_tokens, n, loaded_->multiprocessors);
  std::vector<std::string> names;
  for (std::string_view name : projection_variant_kernels(stage, variant)) names.emplace_back(name);
  return names;
}

AttentionVariant PrefillPlan::attention_variant(const BatchDescription& batch) const {
  const WorkspaceLayout layout = workspace_layout(batch.num_tokens);
  return launched_attention(compiled_.kernels_planned, batch.host_query_starts, batch.host_context_lens,
                            batch.host_span_offsets, batch.host_span_bounds, compiled_.config.query_heads,
                            loaded_->multiprocessors, layout.attention_partial_units)
      .variant;
}

bool PrefillPlan::qkv_postprocess_fused(int num_tokens) const {
  return plan::qkv_postprocess_fused(compiled_.kernels_planned, num_tokens,
                                     static_cast<int>(qkv_row_width(compiled_.config)),
                                     loaded_->multiprocessors);
}

void PrefillPlan::launch_input_norm(const InputNormArgs& args, CUstream stream) const {
  const config::AttentionConfig& config = compiled_.config;
  const RmsNormSpec& spec = compiled_.kernels_planned.input_norm;
  const std::size_t alignment = 2 * spec.tiling.vector;  // the kernel's vector access width in bytes
  require(args.num_tokens >= 0 && args.num_tokens <= config.max_tokens,
          fmt::format("num_tokens: {} is outside [0, max_tokens = {}]", args.num_tokens, config.max_tokens));
  if (args.num_tokens == 0) return;
  require_pointer(args.input, "input", alignment);
  require_pointer(args.weight, "weight", alignment);
  require_pointer(args.output, "output", alignment);

  loaded_->context.make_current();
  enqueue_input_norm(args, stream);
}

void PrefillPlan::enqueue_input_norm(const InputNormArgs& args, CUstream stream,
                                     const Fp8ActivationBuffers* codes, float* rotations,
                                     const BatchDescription* batch) const {
  RmsNormParams params{};
  params.input = static_cast<const bf16_bits*>(args.input);
  params.weight = static_cast<const bf16_bits*>(args.weight);
  params.output = static_cast<bf16_bits*>(args.output);
  params.num_tokens = args.num_tokens;
  params.epsilon = static_cast<float>(compiled_.config.input_norm.epsilon);
  if (codes != nullptr) {
    params.codes = codes->codes;
    params.scales = codes->scales;
    params.ld_codes = compiled_.config.hidden_size;  // fp8_activation_buffers: row stride K bytes
    params.scale_ld = codes->scale_ld;
  }
  if (rotations != nullptr) {
    params.rotations = rotations;
    params.frequencies = loaded_->rope_frequencies.data<const double>();
    params.query_starts = batch->query_starts;
    params.context_lens = batch->context_lens;
    params.num_seqs = batch->num_seqs;
    params.rotation_stride = rope_rotation_stride(2 * compiled_.kernels_planned.input_norm.rotary_pairs);
    params.attention_factor = static_cast<float>(loaded_->rope_attention_factor);
  }
  // One block per token row.
  const unsigned threads = unsigned(compiled_.kernels_planned.input_norm.tiling.threads);
  driver::launch(loaded_->input_norm,
                 driver::LaunchShape{{unsigned(args.num_tokens), 1, 1}, {threads, 1, 1}, 0}, stream, params);
}

void PrefillPlan::launch_kv_store(const KvStoreArgs& args, CUstream stream) const {
  const config::AttentionConfig& config = compiled_.config;
  const KvStoreSpec& spec = compiled_.kernels_planned.kv_store;
  const BatchDescription& batch = args.batch;
  require(batch.num_tokens >= 0 && batch.num_tokens <= config.max_tokens,
          fmt::format("batch.num_tokens: {} is outside [0, max_tokens = {}]", batch.num_tokens,
                      config.max_tokens));
  if (batch.num_tokens == 0) return;
  require(batch.num_seqs >= 1, fmt::format("batch.num_seqs: {} must be at least 1", batch.num_seqs));
  require(batch.max_blocks_per_seq >= 1,
          fmt::format("batch.max_blocks_per_seq: {} must be at least 1", batch.max_blocks_per_seq));
  require(args.cache.num_blocks >= 1,
          fmt::format("cache.num_blocks: {} must be at least 1", args.cache.num_blocks));
  require_pointer(batch.query_starts, "batch.query_starts", 4);
  require_pointer(batch.context_lens, "batch.context_lens", 4);
  require_pointer(batch.block_tables, "batch.block_tables", 4);

  const long long key_width = static_cast<long long>(spec.kv_heads) * spec.head_dim;
  const long long value_width = static_cast<long long>(spec.kv_heads) * spec.value_head_dim;
  const long long key_stride = args.key_row_stride != 0 ? args.key_row_stride : key_width;
  const long long value_stride = args.value_row_stride != 0 ? args.value_row_stride : value_width;
  const int key_vector = vector_width_for(spec.head_dim);
  const int value_vector = vector_width_for(spec.value_head_dim);
  require(key_stride >= key_width && key_stride % key_vector == 0,
          fmt::format("key_row_stride: {} must be >= kv_heads * head_dim = {} and a multiple of {}",
                      key_stride, key_width, key_vector));
  require(value_stride >= value_width && value_stride % value_vector == 0,
          fmt::format("value_row_stride: {} must be >= kv_heads * value_head_dim = {} and a multiple of {}",
                      value_stride, value_width, value_vector));
  require_pointer(args.key, "key", 2 * key_vector);
  require_pointer(args.value, "value", 2 * value_vector);
  const int cache_element_bytes = spec.fp8_cache ? 1 : 2;
  require_pointer(args.cache.key_cache, "cache.key_cache", cache_element_bytes * key_vector);
  require_pointer(args.cache.value_cache, "cache.value_cache", cache_element_bytes * value_vector);
  require_kv_scales(args.cache, spec.fp8_cache);

  KvStoreArgs resolved = args;
  resolved.key_row_stride = key_stride;
  resolved.value_row_stride = value_stride;
  loaded_->context.make_current();
  enqueue_kv_store(resolved, stream);
}

void PrefillPlan::enqueue_kv_store(const KvStoreArgs& args, CUstream stream, int* attention_items,
                                   int attention_counters) const {
  const BatchDescription& batch = args.batch;
  KvStoreParams params{};
  params.key = static_cast<const bf16_bits*>(args.key);
  params.value = static_cast<const bf16_bits*>(args.value);
  params.key_cache = static_cast<bf16_bits*>(args.cache.key_cache);
  params.value_cache = static_cast<bf16_bits*>(args.cache.value_cache);
  params.block_tables = batch.block_tables;
  params.query_starts = batch.query_starts;
  params.context_lens = batch.context_lens;
  params.key_row_stride = args.key_row_stride;
  params.value_row_stride = args.value_row_stride;
  params.num_tokens = batch.num_tokens;
  params.num_seqs = batch.num_seqs;
  params.max_blocks_per_seq = batch.max_blocks_per_seq;
  params.num_blocks = args.cache.num_blocks;
  params.k_scale = args.cache.k_scale;
  params.v_scale = args.cache.v_scale;
  params.attention_items = attention_items;
  params.attention_counters = attention_items != nullptr ? attention_counters : 0;
  // A block stores tokens_per_block whole token rows.
  const auto& tiling = compiled_.kernels_planned.kv_store.tiling;
  const unsigned blocks = unsigned(ceil_div(batch.num_tokens, tiling.tokens_per_block));
  driver::launch(loaded_->kv_store, driver::LaunchShape{{blocks, 1, 1}, {unsigned(tiling.threads), 1, 1}, 0},
                 stream, params);
}

}  // namespace attnplan::plan

namespace attnplan {

plan::PrefillPlan Runtime::load(const plan::CompiledPlan& compiled) {
  const driver::DeviceInfo device = driver::query_device(options_.device);
  const std::string plan_arch = compiled.arch.name();
  const bool compatible = device.major == compiled.arch.major &&
                          (compiled.arch.arch_specific ? device.minor == compiled.arch.minor
                                                       : device.minor >= compiled.arch.minor);
  if (!compatible) {
    throw Error(Stage::input,
                fmt::format("the plan was compiled for {} but device {} ({}) is {}; compile it with "
                            "--arch {} or target.arch \"auto\"",
                            plan_arch, options_.device, device.name, device.arch_name(), device.arch_name()));
  }
  auto loaded = std::make_unique<plan::PrefillPlan::Loaded>(driver::Context(options_.device));
  loaded->multiprocessors = device.multiprocessors;
  loaded->context.make_current();
  for (const plan::PlanKernel& kernel : compiled.kernels) {
    driver::Module& module = loaded->modules.emplace_back(driver::Module::load(kernel.entry->cubin));
    driver::Function function = module.function(kernel.lowered_name);
    const plan::PlannedKernel& planned =
        compiled.kernels_planned.kernels.at(&kernel - compiled.kernels.data());
    const int shared = planned.dynamic_shared_bytes;
    if (shared > 48 * 1024) function.set_max_dynamic_shared_bytes(shared);
    const plan::ProjectionVariant variant = plan::projection_variant_of(planned);
    // The projection stages' functions by variant: the planned GEMM, its short-launch specializations,
    // the dequantized path's kernels.
    const auto projection_slot = [&](driver::Function& planned_function, driver::Function& small,
                                     driver::Function& tiny, driver::Function& dequantize,
                                     driver::Function& dequantized,
                                     driver::Function& dequantized_small) -> driver::Function& {
      switch (variant) {
        case plan::ProjectionVariant::small:
          return small;
        case plan::ProjectionVariant::tiny:
          return tiny;
        case plan::ProjectionVariant::dequantize:
          return dequantize;
        case plan::ProjectionVariant::dequantized:
          return dequantized;
        case plan::ProjectionVariant::dequantized_small:
          return dequantized_small;
        default:
          return planned_function;
      }
    };
    switch (kernel.stage) {
      case plan::StageKind::input_norm:
        loaded->input_norm = function;
        break;
      case plan::StageKind::output_quantize:
        loaded->output_quantize = function;
        break;
      case plan::StageKind::qkv_projection:
        projection_slot(loaded->qkv_projection, loaded->qkv_projection_small, loaded->qkv_projection_tiny,
                        loaded->qkv_dequantize, loaded->qkv_projection_dequantized,
                        loaded->qkv_projection_dequantized_small) = function;
        break;
      case plan::StageKind::qkv_postprocess:
        loaded->qkv_postprocess = function;
        break;
      case plan::StageKind::kv_store:
        loaded->kv_store = function;
        break;
      case plan::StageKind::attention:
        loaded->attention_kernel(plan::attention_variant_named(planned.name)) = function;
        break;
      case plan::StageKind::output_projection:
        projection_slot(loaded->output_projection, loaded->output_projection_small,
                        loaded->output_projection_tiny, loaded->output_dequantize,
                        loaded->output_projection_dequantized, loaded->output_projection_dequantized_small) =
            function;
        break;
    }
  }
  const plan::RopeTable rope = plan::rope_table(compiled.config);
  loaded->rope_attention_factor = rope.attention_factor;
  if (!rope.frequencies.empty()) {
    loaded->rope_frequencies = driver::DeviceBuffer::from_host(rope.frequencies);
  }
  return plan::PrefillPlan(compiled, std::move(loaded));
}

}  // namespace attnplan
