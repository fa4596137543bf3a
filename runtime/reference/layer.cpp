// Spec sections 1-8 chained: the whole prefill layer, stage by stage, as the GPU runs it.
#include "reference/layer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "reference/bf16.hpp"
#include "reference/fp8_activation.hpp"
#include "reference/rmsnorm.hpp"

namespace attnplan::reference {
namespace {

[[noreturn]] void fail(std::string message) {
  throw Error(Stage::input, "prefill_layer: " + std::move(message));
}

// A weight the config promises (or rules out) must be there (or absent): a mismatch is a loader bug,
// and silently skipping a bias would make the reference agree with a kernel that skipped it too.
void check_presence(std::string_view name, bool configured, std::size_t size, std::string_view config_field) {
  if (configured && size == 0) fail(fmt::format("{} is missing but the config sets {}", name, config_field));
  if (!configured && size != 0)
    fail(fmt::format("{} is given but the config does not set {}", name, config_field));
}

void check_weights(const config::AttentionConfig& config, const LayerWeights& weights) {
  check_presence("q_bias", config.qkv_bias, weights.q_bias.size(), "qkv_bias");
  check_presence("k_bias", config.qkv_bias, weights.k_bias.size(), "qkv_bias");
  check_presence("v_bias", config.qkv_bias, weights.v_bias.size(), "qkv_bias");
  check_presence("o_bias", config.output_bias, weights.o_bias.size(), "output_bias");
  check_presence("q_norm", config.qkv_norm.query, weights.q_norm.size(), "qkv_norm.query");
  check_presence("k_norm", config.qkv_norm.key, weights.k_norm.size(), "qkv_norm.key");
  check_presence("sinks", config.sinks, weights.sinks.size(), "sinks");

  // linear() checks each weight's input width; the output widths decide the head split, checked here.
  const auto check_rows = [](std::string_view name, const Tensor& weight, std::int64_t rows,
                             std::string_view what) {
    if (weight.rank() != 2 || weight.extent(0) != rows) {
      fail(fmt::format("{} is [{}]; it must have {} = {} rows", name, fmt::join(weight.shape, ", "), what,
                       rows));
    }
  };
  const std::int64_t query_width = std::int64_t{config.query_heads} * config.head_dim;
  check_rows("q_proj", weights.q_proj, query_width, "query_heads * head_dim");
  check_rows("k_proj", weights.k_proj, std::int64_t{config.kv_heads} * config.head_dim,
             "kv_heads * head_dim");
  check_rows("v_proj", weights.v_proj, std::int64_t{config.kv_heads} * config.value_head_dim,
             "kv_heads * value_head_dim");
  check_rows("o_proj", weights.o_proj, config.hidden_size, "hidden_size");
}

// [T, heads * dim] -> [T, heads, dim], same data.
Tensor split_heads(Tensor flat, std::int64_t heads, std::int64_t dim) {
  const std::int64_t tokens = flat.extent(0);
  return Tensor({tokens, heads, dim}, std::move(flat.data));
}

// What attention() would reject after kv_store() has written the cache, checked before the write so that
// a bad input leaves the cache as it was (spec section 8). kv_store() checks the chunk's own slots.
void check_before_store(const config::AttentionConfig& config, const Batch& batch, const Spans& spans,
                        const PagedKvCache& cache) {
  if (!spans.bounds.empty() && !config.bidirectional_spans) {
    fail(fmt::format("{} bidirectional spans given, but the config has bidirectional_spans false",
                     spans.bounds.size()));
  }
  if (cache.key.rank() != 4)
    fail(fmt::format("cache key is [{}]; it must be rank 4", fmt::join(cache.key.shape, ", ")));
  const bool fp8_config = config.kv_cache.dtype == config::KvCacheDtype::fp8_e4m3;
  if (cache.fp8.has_value() != fp8_config) {
    fail(fmt::format("the cache is {} but the config's kv_cache.dtype is {}", cache.fp8 ? "fp8" : "bf16",
                     config::to_string(config.kv_cache.dtype)));
  }
  // The prefix's pages are read, not written, so kv_store() does not look at their block table entries.
  for (int s = 0; s < batch.num_seqs(); ++s) {
    if (batch.query_starts[s + 1] == batch.query_starts[s]) continue;  // no queries read this prefix
    for (std::int64_t position = 0; position < batch.context_lens[s]; ++position) {
      slot_of(batch, s, position, cache.block_size(), cache.num_blocks());
    }
  }
}

}  // namespace

Tensor projection_input(const Tensor& x, const config::WeightEncoding& encoding) {
  if (encoding.format != config::WeightFormat::fp8 || encoding.activation != config::ActivationType::fp8)
    return x;
  const std::int64_t k = x.rank() == 0 ? 0 : x.extent(x.rank() - 1);
  const std::int64_t rows = k == 0 ? 0 : static_cast<std::int64_t>(x.data.size()) / k;
  const Tensor read = dequantize_activations_fp8(
      quantize_activations_fp8(tensor_to_bf16(x), static_cast<int>(rows), static_cast<int>(k),
                               config::fp8_activation_scales(encoding.scale_granularity)));
  return Tensor(x.shape, read.data);
}

LayerStages prefill_layer(const config::AttentionConfig& config, const LayerWeights& weights,
                          const Tensor& hidden_states, const Batch& batch, const Spans& spans,
                          PagedKvCache& cache, const LayerOptions& options) {
  if (hidden_states.rank() != 2 || hidden_states.extent(1) != config.hidden_size) {
    fail(fmt::format("hidden_states is [{}]; it must be [tokens, hidden_size = {}]",
                     fmt::join(hidden_states.shape, ", "), config.hidden_size));
  }
  const std::int64_t tokens = hidden_states.extent(0);
  validate_batch(batch, tokens);
  validate_spans(spans, batch);
  check_weights(config, weights);
  check_before_store(config, batch, spans, cache);

  // Where the GPU stores a stage's result in bf16, the reference rounds it the same way (layer.hpp).
  const auto stored = [&](Tensor tensor) {
    return options.round_between_stages ? round_to_bf16(std::move(tensor)) : tensor;
  };

  LayerStages stages;
  // 1. Input norm.
  stages.normed = stored(
      rmsnorm(hidden_states, weights.input_norm, config.input_norm.epsilon, config.input_norm.weight_offset));

  // 2. QKV projection, split into heads (fp8 activations: over the quantized normed rows).
  const Tensor qkv_input = projection_input(stages.normed, config.projection.qkv);
  stages.q = stored(
      split_heads(linear(qkv_input, weights.q_proj, weights.q_bias), config.query_heads, config.head_dim));
  stages.k = stored(
      split_heads(linear(qkv_input, weights.k_proj, weights.k_bias), config.kv_heads, config.head_dim));
  stages.v = stored(
      split_heads(linear(qkv_input, weights.v_proj, weights.v_bias), config.kv_heads, config.value_head_dim));

  // 3. Per-head norms over head_dim (one weight shared by every head), then 4. RoPE at context_len + i.
  // The GPU fuses norm and RoPE and stores once, so there is one rounding after both.
  const double qkv_epsilon = config.qkv_norm_epsilon();
  const double qkv_offset = config.qkv_norm.weight_offset;
  Tensor q_final =
      config.qkv_norm.query ? rmsnorm(stages.q, weights.q_norm, qkv_epsilon, qkv_offset) : stages.q;
  Tensor k_final =
      config.qkv_norm.key ? rmsnorm(stages.k, weights.k_norm, qkv_epsilon, qkv_offset) : stages.k;
  Tensor v_final =
      config.qkv_norm.value ? rmsnorm(stages.v, {}, qkv_epsilon) : stages.v;  // no weight (Gemma 3n)
  std::vector<std::int64_t> positions;
  positions.reserve(static_cast<std::size_t>(tokens));
  for (const TokenPosition& token : token_positions(batch, tokens)) positions.push_back(token.position);
  apply_rope(q_final, positions, config);
  apply_rope(k_final, positions, config);
  stages.q_final = stored(std::move(q_final));
  stages.k_final = stored(std::move(k_final));
  stages.v_final = stored(std::move(v_final));

  // 5. The chunk's k and v into their slots (checked before anything is written), then 6. attention over
  // the cache, which now holds the prefix and the chunk.
  kv_store(stages.k_final, stages.v_final, batch, cache);
  Tensor attended = attention(stages.q_final, cache, batch, spans, config, weights.sinks);
  stages.attention = stored(
      Tensor({tokens, std::int64_t{config.query_heads} * config.value_head_dim}, std::move(attended.data)));

  // 7. Output projection (fp8 activations: over the quantized attention rows); the GPU writes bf16, so it
  // is rounded too.
  stages.output = stored(
      linear(projection_input(stages.attention, config.projection.output), weights.o_proj, weights.o_bias));
  return stages;
}

}  // namespace attnplan::reference
