#include "check/bench_counts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "plan/gemm_fp8.hpp"

namespace attnplan::check {

std::vector<int> varlen_split(int tokens, int seqs) {
  if (seqs < 1 || seqs > tokens) {
    throw Error(Stage::input, fmt::format("--seqs {}: need 1 <= seqs <= tokens ({} tokens)", seqs, tokens));
  }
  // Cumulative share of sequences 0..i is (i + 1)(i + 2) / (S (S + 1)) of the tokens (weights 1, 2, ..., S),
  // rounded down; each length is then raised to at least 1 by taking from the longest.
  const long long total_weight = static_cast<long long>(seqs) * (seqs + 1) / 2;
  std::vector<int> lengths(static_cast<std::size_t>(seqs));
  long long previous = 0;
  for (int i = 0; i < seqs; ++i) {
    const long long weight = static_cast<long long>(i + 1) * (i + 2) / 2;
    const long long cumulative = static_cast<long long>(tokens) * weight / total_weight;
    lengths[static_cast<std::size_t>(i)] = static_cast<int>(cumulative - previous);
    previous = cumulative;
  }
  for (int& length : lengths) {
    if (length == 0) {
      length = 1;
      --*std::max_element(lengths.begin(), lengths.end());
    }
  }
  return lengths;
}

std::int64_t allowed_pairs(const SequenceShape& sequence, int window) {
  std::int64_t pairs = 0;
  std::size_t span = 0;
  const int end = sequence.context_len + sequence.chunk_len;
  for (int query = sequence.context_len; query < end; ++query) {
    // Causal keys [low, query]; the span holding the query (if any) adds [start, end) as a union.
    const int low = window > 0 ? std::max(0, query - window + 1) : 0;
    std::int64_t keys = query - low + 1;
    while (span < sequence.spans.size() && sequence.spans[span][1] <= query) ++span;
    if (span < sequence.spans.size() && sequence.spans[span][0] <= query) {
      const int start = sequence.spans[span][0], stop = std::min(sequence.spans[span][1], end);
      // |[low, query] U [start, stop)| = both lengths minus the overlap.
      const int overlap = std::max(0, std::min(query + 1, stop) - std::max(low, start));
      keys += (stop - start) - overlap;
    }
    pairs += keys;
  }
  return pairs;
}

std::vector<StageWork> stage_work(const config::AttentionConfig& config,
                                  const std::vector<SequenceShape>& batch) {
  constexpr double kBf16 = 2;
  double tokens = 0, pairs = 0;
  for (const SequenceShape& sequence : batch) {
    tokens += sequence.chunk_len;
    pairs += static_cast<double>(allowed_pairs(sequence, config.sliding_window.value_or(0)));
  }
  const double hidden = config.hidden_size, hq = config.query_heads, hkv = config.kv_heads;
  const double d = config.head_dim, dv = config.value_head_dim;
  const double q_width = hq * d, k_width = hkv * d, v_width = hkv * dv;
  const double qkv_width = q_width + k_width + v_width, attention_width = hq * dv;

  std::vector<StageWork> work;
  // fp8 codes: 1 byte per channel plus an f32 scale per token, or per token and 128 channels
  // (config::fp8_activation_scales of the projection's weight scales).
  const auto code_bytes = [&](double k, const config::WeightEncoding& encoding) {
    const bool per_token =
        config::fp8_activation_scales(encoding.scale_granularity) == config::Fp8ActivationScales::token;
    return tokens * k + tokens * (per_token ? 1.0 : std::ceil(k / 128)) * 4;
  };
  // RMSNorm: read the input, write the normed rows (the [hidden] weight is noise), or instead the q|k|v
  // projection's fp8 codes where it takes fp8 activations (RmsNormSpec::fp8_codes).
  const bool norm_codes = plan::uses_fp8_activations(config.projection.qkv);
  work.push_back({plan::StageKind::input_norm, 0,
                  tokens * hidden * kBf16 +
                      (norm_codes ? code_bytes(hidden, config.projection.qkv) : tokens * hidden * kBf16) +
                      hidden * kBf16});

  // GEMMs: A [T, K] and C [T, N] once, the weight [N, K] once.
  work.push_back({plan::StageKind::qkv_projection, 2 * tokens * qkv_width * hidden,
                  (tokens * hidden + qkv_width * hidden + tokens * qkv_width) * kBf16});
  // Norms and RoPE rewrite the q / k (/ v) rows they change in place: read and write each once.
  const bool rope = config.rotary_dim() > 0;
  const double changed = ((rope || config.qkv_norm.query) ? q_width : 0) +
                         ((rope || config.qkv_norm.key) ? k_width : 0) +
                         (config.qkv_norm.value ? v_width : 0);
  if (changed > 0) work.push_back({plan::StageKind::qkv_postprocess, 0, tokens * changed * 2 * kBf16});
  // The store reads the chunk's k and v rows and writes them to their slots.
  work.push_back({plan::StageKind::kv_store, 0, tokens * (k_width + v_width) * 2 * kBf16});
  work.push_back({plan::StageKind::attention, 2 * (d + dv) * hq * pairs, 0});
  // fp8 activations on the output projection: the quantizer reads the bf16 rows once and writes the codes.
  if (plan::uses_fp8_activations(config.projection.output)) {
    work.push_back(
        {plan::StageKind::output_quantize, 0,
         tokens * attention_width * kBf16 + code_bytes(attention_width, config.projection.output)});
  }
  work.push_back({plan::StageKind::output_projection, 2 * tokens * hidden * attention_width,
                  (tokens * attention_width + hidden * attention_width + tokens * hidden) * kBf16});
  return work;
}

Spread spread(std::vector<double> samples) {
  if (samples.empty()) throw Error(Stage::input, "spread: no timings");
  std::sort(samples.begin(), samples.end());
  const std::size_t middle = samples.size() / 2;
  const double median =
      samples.size() % 2 == 1 ? samples[middle] : (samples[middle - 1] + samples[middle]) / 2;
  return {median, samples.front(), samples.back()};
}

int rotation_sets(std::size_t set_bytes, std::size_t l2_bytes, std::size_t free_bytes) {
  const std::size_t bytes = std::max<std::size_t>(set_bytes, 1);
  std::size_t sets = std::clamp<std::size_t>((2 * l2_bytes + bytes - 1) / bytes, 2, 64);
  sets = std::min(sets, free_bytes / 2 / bytes);
  return static_cast<int>(std::max<std::size_t>(sets, 1));
}

}  // namespace attnplan::check
