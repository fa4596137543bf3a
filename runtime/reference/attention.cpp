// Spec section 6: attention of the chunk's queries over the paged cache, one query row at a time.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "core/error.hpp"
#include "reference/layer.hpp"
#include "reference/parallel.hpp"

namespace attnplan::reference {
namespace {

[[noreturn]] void fail(std::string message) {
  throw Error(Stage::input, "attention: " + std::move(message));
}

void check_shapes(const Tensor& q, const PagedKvCache& cache) {
  if (q.rank() != 3)
    fail(fmt::format("q must be [tokens, query_heads, head_dim], got [{}]", fmt::join(q.shape, ", ")));
  if (cache.key.rank() != 4 || cache.value.rank() != 4) {
    fail(fmt::format("cache key and value must be [num_blocks, block_size, kv_heads, dim], got [{}] and [{}]",
                     fmt::join(cache.key.shape, ", "), fmt::join(cache.value.shape, ", ")));
  }
  if (cache.value.extent(0) != cache.key.extent(0) || cache.value.extent(1) != cache.key.extent(1) ||
      cache.value.extent(2) != cache.key.extent(2)) {
    fail(fmt::format("cache key [{}] and value [{}] disagree on num_blocks, block_size or kv_heads",
                     fmt::join(cache.key.shape, ", "), fmt::join(cache.value.shape, ", ")));
  }
  if (cache.key.extent(3) != q.extent(2)) {
    fail(fmt::format("q has head_dim {} but the cache's keys have {}", q.extent(2), cache.key.extent(3)));
  }
  const std::int64_t kv_heads = cache.key.extent(2);
  if (kv_heads <= 0 || q.extent(1) % kv_heads != 0) {
    fail(fmt::format("{} query heads cannot share {} kv heads evenly", q.extent(1), kv_heads));
  }
  if (cache.block_size() <= 0) fail(fmt::format("block_size is {}; it must be positive", cache.block_size()));
}

void check_config(const config::AttentionConfig& config, const Spans& spans, std::span<const double> sinks,
                  std::int64_t query_heads) {
  if (config.sliding_window && *config.sliding_window < 1) {
    throw Error(Stage::config, fmt::format("sliding_window is {}; it must be >= 1", *config.sliding_window));
  }
  if (config.softcap && !(*config.softcap > 0.0)) {
    throw Error(Stage::config, fmt::format("softcap is {}; it must be positive", *config.softcap));
  }
  // Spans change the mask; handing them to a config that does not accept them is a contradiction between
  // the input and the plan (spec section 8), not something to ignore silently.
  if (!spans.bounds.empty() && !config.bidirectional_spans) {
    fail(fmt::format("{} bidirectional spans given, but the config has bidirectional_spans false",
                     spans.bounds.size()));
  }
  if (config.sinks && static_cast<std::int64_t>(sinks.size()) != query_heads) {
    fail(fmt::format("the config has sinks: {} sink logits given for {} query heads", sinks.size(),
                     query_heads));
  }
  if (!config.sinks && !sinks.empty()) {
    fail(fmt::format("{} sink logits given, but the config has sinks false", sinks.size()));
  }
}

// The span of `seq` holding `position`, if any. Spans are disjoint, so there is at most one.
std::optional<std::array<int, 2>> span_holding(const Spans& spans, int seq, std::int64_t position) {
  if (spans.offsets.empty()) return std::nullopt;
  for (int j = spans.offsets[seq]; j < spans.offsets[seq + 1]; ++j) {
    const std::array<int, 2>& span = spans.bounds[static_cast<std::size_t>(j)];
    if (span[0] <= position && position < span[1]) return span;
  }
  return std::nullopt;
}

// Attention of the token rows `rows` (indices into the chunk's [tokens] rows, in any order), whose queries
// are q [rows.size(), Hq, D] in that order, into output [rows.size(), Hq, Dv]. attention() passes every row;
// attention_rows() a sample, where the whole chunk would cost minutes (attnplan bench's spot check).
Tensor attend(const Tensor& q, std::span<const std::int64_t> rows, std::int64_t tokens,
              const PagedKvCache& cache, const Batch& batch, const Spans& spans,
              const config::AttentionConfig& config, std::span<const double> sinks) {
  check_shapes(q, cache);
  const std::int64_t query_heads = q.extent(1);
  const std::int64_t head_dim = q.extent(2);
  const std::int64_t kv_heads = cache.key.extent(2);
  const std::int64_t value_head_dim = cache.value.extent(3);
  const std::int64_t group_size = query_heads / kv_heads;  // query heads per kv head (GQA)
  validate_batch(batch, tokens);
  validate_spans(spans, batch);
  check_config(config, spans, sinks, query_heads);
  if (q.extent(0) != static_cast<std::int64_t>(rows.size())) {
    fail(fmt::format("q holds {} rows for {} row indices", q.extent(0), rows.size()));
  }
  for (const std::int64_t row : rows) {
    if (row < 0 || row >= tokens) fail(fmt::format("row {} outside the chunk's {} token rows", row, tokens));
  }

  // The shapes come from the tensors; the config supplies the semantics. parse() resolves the scale; a
  // config built in code may leave it unset, and then it is the same default 1/sqrt(D).
  const double scale = config.attention_scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim)));
  const std::vector<TokenPosition> positions = token_positions(batch, tokens);

  // The slot of every visible key position of every sequence, found (and its block table checked) before
  // any arithmetic: positions 0 .. context_len + chunk length - 1.
  std::vector<std::vector<std::int64_t>> key_slots(static_cast<std::size_t>(batch.num_seqs()));
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const std::int64_t total_len =
        std::int64_t{batch.context_lens[s]} + (batch.query_starts[s + 1] - batch.query_starts[s]);
    if (total_len == batch.context_lens[s]) continue;  // no queries: its keys are never read
    std::vector<std::int64_t>& slots = key_slots[static_cast<std::size_t>(s)];
    slots.reserve(static_cast<std::size_t>(total_len));
    for (std::int64_t position = 0; position < total_len; ++position) {
      slots.push_back(slot_of(batch, s, position, cache.block_size(), cache.num_blocks()));
    }
  }

  const std::int64_t count = static_cast<std::int64_t>(rows.size());
  Tensor output({count, query_heads, value_head_dim});
  // One work item per (sampled row, query head): [rows * query_heads].
  detail::parallel_for(count * query_heads, [&](std::int64_t item) {
    const std::int64_t row = item / query_heads;  // in q and output
    const std::int64_t head = item % query_heads;
    const std::int64_t kv_head = head / group_size;
    const TokenPosition& query = positions[static_cast<std::size_t>(rows[static_cast<std::size_t>(row)])];
    const std::int64_t query_position = query.position;
    const std::vector<std::int64_t>& slots = key_slots[static_cast<std::size_t>(query.seq)];
    const std::optional<std::array<int, 2>> own_span = span_holding(spans, query.seq, query_position);

    // allowed(pq, pk) = (pk <= pq and (no window or pk > pq - W)) or (pq and pk in the same span).
    // The spec's "inside a bidirectional span [start, end): start <= pq, pk < end" is read as both the
    // query and the key inside one span, as HF Gemma 3 masks it (token_type_ids_mask_function: an image
    // token attends to every token of its own image, later ones included). Queries outside any span
    // keep the plain causal / sliding rule, so a span never widens their window.
    auto allowed = [&](std::int64_t key_position) {
      const bool causal = key_position <= query_position;
      const bool in_window = !config.sliding_window || key_position > query_position - *config.sliding_window;
      const bool in_own_span = own_span && (*own_span)[0] <= key_position && key_position < (*own_span)[1];
      return (causal && in_window) || in_own_span;
    };

    // Raw pointers in the inner loops: span indexing costs a call per element in Debug builds.
    const double* query_row = q.row(row * query_heads + head).data();  // [head_dim]
    std::vector<std::int64_t> visible;                                 // slots of the allowed keys
    std::vector<double> logits;                                        // their scaled (and capped) scores
    const std::int64_t total_len = static_cast<std::int64_t>(slots.size());
    for (std::int64_t key_position = 0; key_position < total_len; ++key_position) {
      if (!allowed(key_position)) continue;
      const std::int64_t slot = slots[static_cast<std::size_t>(key_position)];
      const double* key_row = cache.key.row(slot * kv_heads + kv_head).data();  // [head_dim]
      double dot = 0.0;
      for (std::int64_t d = 0; d < head_dim; ++d) dot += query_row[d] * key_row[d];
      double score = scale * dot;
      if (config.softcap) score = *config.softcap * std::tanh(score / *config.softcap);
      visible.push_back(slot);
      logits.push_back(score);
    }

    // softmax with the optional sink in the denominator only; S_h is used as given (not scaled).
    // With no allowed key (impossible while a query sees itself: W >= 1) the output row stays 0.
    if (visible.empty()) return;
    double max_logit = *std::max_element(logits.begin(), logits.end());
    if (config.sinks) max_logit = std::max(max_logit, sinks[static_cast<std::size_t>(head)]);
    double denominator = config.sinks ? std::exp(sinks[static_cast<std::size_t>(head)] - max_logit) : 0.0;
    double* out_row = output.row(row * query_heads + head).data();  // [value_head_dim]
    for (std::size_t j = 0; j < visible.size(); ++j) {
      const double weight = std::exp(logits[j] - max_logit);
      denominator += weight;
      const double* value_row = cache.value.row(visible[j] * kv_heads + kv_head).data();  // [value_head_dim]
      for (std::int64_t d = 0; d < value_head_dim; ++d) out_row[d] += weight * value_row[d];
    }
    for (std::int64_t d = 0; d < value_head_dim; ++d) out_row[d] /= denominator;
  });
  return output;
}

}  // namespace

Tensor attention(const Tensor& q, const PagedKvCache& cache, const Batch& batch, const Spans& spans,
                 const config::AttentionConfig& config, std::span<const double> sinks) {
  check_shapes(q, cache);  // before q.extent(0): names the shape q should have
  std::vector<std::int64_t> rows(static_cast<std::size_t>(q.extent(0)));
  std::iota(rows.begin(), rows.end(), std::int64_t{0});
  return attend(q, rows, q.extent(0), cache, batch, spans, config, sinks);
}

Tensor attention_rows(const Tensor& q_rows, std::span<const std::int64_t> rows, std::int64_t tokens,
                      const PagedKvCache& cache, const Batch& batch, const Spans& spans,
                      const config::AttentionConfig& config, std::span<const double> sinks) {
  return attend(q_rows, rows, tokens, cache, batch, spans, config, sinks);
}

}  // namespace attnplan::reference
