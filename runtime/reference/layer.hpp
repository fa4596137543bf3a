// The whole prefill layer on the CPU in double precision (spec sections 1-8), stage by stage. Written
// from the spec alone; shares no code with the kernels. The source of truth for the GPU tests and
// `attnplan verify`.
//
// Storage precision: the GPU keeps activations in bf16 between stages. With `round_between_stages`
// (the default) the reference rounds each stage's output to bf16 where the GPU stores one, so a GPU
// stage is compared with the exact result of the same stored inputs, and per-stage errors stay tight.
// The arithmetic inside a stage is always double.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "config/attention_config.hpp"
#include "reference/batch.hpp"
#include "reference/kv_store.hpp"
#include "reference/tensor.hpp"

namespace attnplan::reference {

// The layer's weights as HF stores them (a projection weight is [out, in]). A fused qkv_proj is split
// into q/k/v by the loader before it gets here. Empty vectors mean "absent" (no bias, no norm weight).
struct LayerWeights {
  std::vector<double> input_norm;  // [hidden]
  Tensor q_proj;                   // [Hq * D, hidden]
  Tensor k_proj;                   // [Hkv * D, hidden]
  Tensor v_proj;                   // [Hkv * Dv, hidden]
  std::vector<double> q_bias;      // [Hq * D] or empty
  std::vector<double> k_bias;      // [Hkv * D] or empty
  std::vector<double> v_bias;      // [Hkv * Dv] or empty
  std::vector<double> q_norm;      // [D] or empty (qkv_norm.query)
  std::vector<double> k_norm;      // [D] or empty (qkv_norm.key)
  Tensor o_proj;                   // [hidden, Hq * Dv]
  std::vector<double> o_bias;      // [hidden] or empty
  std::vector<double> sinks;       // [Hq] or empty (config.sinks)
};

// Bidirectional spans as CSR (spec section 8): sequence s owns spans [offsets[s], offsets[s + 1]) of
// `bounds`, each [start, end) in absolute positions of that sequence. Empty `offsets` means no spans.
struct Spans {
  std::vector<int> offsets;                // [num_seqs + 1] or empty
  std::vector<std::array<int, 2>> bounds;  // [num_spans]
};

// Throws Error(input) naming the field ("spans: span 2 of sequence 1 [10, 20) straddles context_len 15
// ..."): the batch itself (validate_batch over query_starts.back() tokens); offsets of the wrong size,
// not starting at 0, decreasing or not ending at bounds.size(); spans unsorted or overlapping within a
// sequence, empty, negative, past that sequence's context_len + chunk length, or straddling its
// context_len (start < context_len < end). A span wholly inside the cached prefix is valid.
void validate_spans(const Spans& spans, const Batch& batch);

// x W^T + b for x [M, K], W [N, K], b [N] or empty -> [M, N]. x may have more leading dimensions
// ([..., K] -> [..., N]), e.g. the attention output [T, Hq, Dv] for o_proj. Each output is one sum over
// k in increasing order, in double.
Tensor linear(const Tensor& x, const Tensor& weight, std::span<const double> bias);

// What a projection of `encoding` reads from x [..., K]: x itself; with fp8 activations (fp8 weights,
// activation "fp8") x rounded to bf16 as the GPU stores it, quantized per token (tensor and channel weight
// scales) or per token and group of 128 channels (block weight scales; config::fp8_activation_scales)
// (quantize_activations_fp8, bit for bit the kernel's rule) and read back as code * scale.
Tensor projection_input(const Tensor& x, const config::WeightEncoding& encoding);

// The RoPE frequencies f_i = theta^(-2i/R), i in [0, R/2) (R = config.rotary_dim(); empty for R = 0),
// after the config's scaling (spec section 4; matches HF `modeling_rope_utils` default/linear/llama3/
// yarn), and the factor that multiplies cos and sin (yarn's attention_factor, default
// 0.1 ln(factor) + 1 when factor > 1; 1 for every other type).
std::vector<double> rope_frequencies(const config::AttentionConfig& config);
double rope_attention_factor(const config::AttentionConfig& config);

// Rotates x [T, heads, D] in place: token t at positions[t], pairs per spec section 4 (offset o, rotary
// dim R, pairing dim P2; dimensions in no pair unchanged). A no-op for R = 0. Error(config) for pairs
// that do not fit in D; Error(input) when positions.size() != T.
void apply_rope(Tensor& x, std::span<const std::int64_t> positions, const config::AttentionConfig& config);

// Attention of q [T, Hq, D] over the paged cache (which already holds this chunk's k and v), spec
// section 6: scale, softcap, causal, sliding window, bidirectional spans, GQA, sinks. -> [T, Hq, Dv].
// Shapes come from the tensors (Hkv and Dv from the cache); the config gives the semantics (scale,
// defaulting to 1/sqrt(D) when unset; softcap; window; whether spans and sinks are accepted).
// Decisions where the spec is terse:
//  - Span rule: a query and a key attend bidirectionally when both lie in the same span
//    [start, end) (start <= pq < end and start <= pk < end), as HF Gemma 3 masks image tokens; the
//    span is OR-ed with the causal/window rule, so it never widens a query outside it.
//  - sinks: [Hq] logits used unscaled, in the denominator only; must be given iff config.sinks.
//  - spans given with config.bidirectional_spans false: Error(input) (input contradicts the plan).
//  - A query with no allowed key (impossible while a query sees itself) gets an all-zero row.
Tensor attention(const Tensor& q, const PagedKvCache& cache, const Batch& batch, const Spans& spans,
                 const config::AttentionConfig& config, std::span<const double> sinks);

// The same for a sample of the chunk's token rows: `rows` indexes the batch's [tokens] rows (any order,
// repeats allowed) and q_rows [rows.size(), Hq, D] holds their queries in that order -> [rows.size(), Hq,
// Dv], equal to those rows of attention() on the whole chunk. Error(input) for a row outside [0, tokens) or a
// q_rows whose first extent is not rows.size(). For spot checks where the whole chunk would take minutes.
Tensor attention_rows(const Tensor& q_rows, std::span<const std::int64_t> rows, std::int64_t tokens,
                      const PagedKvCache& cache, const Batch& batch, const Spans& spans,
                      const config::AttentionConfig& config, std::span<const double> sinks);

// Every stage's output, for per-stage comparison.
struct LayerStages {
  Tensor normed;     // [T, hidden]        input RMSNorm
  Tensor q, k, v;    // [T, H, D|Dv]       after the projection (+ bias)
  Tensor q_final;    // [T, Hq, D]         after q norm and RoPE
  Tensor k_final;    // [T, Hkv, D]        after k norm and RoPE (what the cache holds)
  Tensor v_final;    // [T, Hkv, Dv]       after the optional v norm
  Tensor attention;  // [T, Hq * Dv]
  Tensor output;     // [T, hidden]
};

struct LayerOptions {
  bool round_between_stages = true;
};

// Runs the whole layer on hidden_states [T, hidden]; writes the chunk's k and v into `cache` (which
// holds the cached prefix already). Validates the batch and spans first (Error(input)), and every other
// input attention() would reject, so a rejected call leaves the cache unchanged. The weights must match
// the config: a bias, norm weight or sink array is present exactly when the config enables it.
// Rounding points (with round_between_stages): normed; q, k, v; q_final, k_final, v_final (once, after
// the per-head norm and RoPE together); attention; output. Positions are context_len + i. A projection
// with fp8 activations reads projection_input(its input) (always: the kernel's rounding, not storage).
LayerStages prefill_layer(const config::AttentionConfig& config, const LayerWeights& weights,
                          const Tensor& hidden_states, const Batch& batch, const Spans& spans,
                          PagedKvCache& cache, const LayerOptions& options = {});

}  // namespace attnplan::reference
