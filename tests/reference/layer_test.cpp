// prefill_layer(): the stages chained as the spec orders them, and the property chunked prefill relies
// on: a sequence run as one chunk, or as a cached prefix plus the rest, gives the same tokens and cache.
#include <cmath>
#include <cstdint>
#include <vector>

#include "layer_testing.hpp"
#include "reference/bf16.hpp"
#include "reference/layer.hpp"
#include "reference/rmsnorm.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using attnplan::Stage;
using attnplan::config::AttentionConfig;
using attnplan::config::RopeScalingType;
using attnplan::reference::Batch;
using attnplan::reference::LayerOptions;
using attnplan::reference::LayerStages;
using attnplan::reference::LayerWeights;
using attnplan::reference::PagedKvCache;
using attnplan::reference::prefill_layer;
using attnplan::reference::Spans;
using attnplan::reference::Tensor;

namespace {

constexpr int kBlockSize = 2;
constexpr int kPages = 6;

// Every optional feature on at once, so the chunking property covers them all: biases, Gemma-style
// q/k norms (1 + w), a v norm, yarn RoPE at half the head, a window, sinks and spans.
AttentionConfig full_config() {
  AttentionConfig config = attnplan::reference::testing::small_config(2, 1, 4, 4);
  config.hidden_size = 8;
  config.qkv_bias = true;
  config.output_bias = true;
  config.qkv_norm.query = config.qkv_norm.key = config.qkv_norm.value = true;
  config.qkv_norm.weight_offset = 1.0;
  config.rotary.theta = 100.0;
  config.rotary.dim = 2;
  config.rotary.pairing_dim = 2;
  config.rotary.scaling.type = RopeScalingType::yarn;
  config.rotary.scaling.factor = 4.0;
  config.rotary.scaling.original_max_position = 16;
  config.rotary.scaling.attention_factor.reset();
  config.sliding_window = 4;
  config.softcap = 5.0;
  config.sinks = true;
  config.bidirectional_spans = true;
  attnplan::config::resolve_defaults(config);
  return config;
}

// Deterministic values in [-1, 1), already bf16 like real inputs.
std::vector<double> values(std::size_t count, unsigned seed) {
  std::vector<double> out(count);
  std::uint32_t state = seed * 2654435761u + 12345u;
  for (double& value : out) {
    state = state * 1664525u + 1013904223u;
    value = static_cast<double>(state >> 8) / static_cast<double>(1u << 24) * 2.0 - 1.0;
  }
  return attnplan::reference::round_to_bf16(Tensor({static_cast<std::int64_t>(count)}, out)).data;
}

Tensor random_tensor(std::vector<std::int64_t> shape, unsigned seed) {
  const auto count = static_cast<std::size_t>(attnplan::reference::element_count_of(shape));
  return Tensor(std::move(shape), values(count, seed));
}

LayerWeights weights_for(const AttentionConfig& config) {
  const std::int64_t hidden = config.hidden_size;
  const std::int64_t q_width = std::int64_t{config.query_heads} * config.head_dim;
  const std::int64_t k_width = std::int64_t{config.kv_heads} * config.head_dim;
  const std::int64_t v_width = std::int64_t{config.kv_heads} * config.value_head_dim;
  const auto head_dim = static_cast<std::size_t>(config.head_dim);
  LayerWeights weights;
  weights.input_norm = values(static_cast<std::size_t>(hidden), 1);
  weights.q_proj = random_tensor({q_width, hidden}, 2);
  weights.k_proj = random_tensor({k_width, hidden}, 3);
  weights.v_proj = random_tensor({v_width, hidden}, 4);
  if (config.qkv_bias) {
    weights.q_bias = values(static_cast<std::size_t>(q_width), 5);
    weights.k_bias = values(static_cast<std::size_t>(k_width), 6);
    weights.v_bias = values(static_cast<std::size_t>(v_width), 7);
  }
  if (config.qkv_norm.query) weights.q_norm = values(head_dim, 8);
  if (config.qkv_norm.key) weights.k_norm = values(head_dim, 9);
  weights.o_proj = random_tensor({hidden, std::int64_t{config.query_heads} * config.value_head_dim}, 10);
  if (config.output_bias) weights.o_bias = values(static_cast<std::size_t>(hidden), 11);
  if (config.sinks) weights.sinks = values(static_cast<std::size_t>(config.query_heads), 12);
  return weights;
}

// One sequence's chunk [context_len, context_len + tokens) on pages 4, 0, 5, 2 (out of order on purpose).
Batch chunk(int context_len, int tokens) {
  Batch batch;
  batch.query_starts = {0, tokens};
  batch.context_lens = {context_len};
  batch.max_blocks_per_seq = 4;
  batch.block_tables = {4, 0, 5, 2};
  return batch;
}

PagedKvCache empty_cache(const AttentionConfig& config) {
  return PagedKvCache::filled(kPages, kBlockSize, config.kv_heads, config.head_dim, config.value_head_dim,
                              -7.0);
}

// Rows [first, first + count) of a [T, ...] tensor, flattened.
std::vector<double> rows_of(const Tensor& tensor, std::int64_t first, std::int64_t count) {
  const std::int64_t width = tensor.element_count() / tensor.extent(0);
  return {tensor.data.begin() + first * width, tensor.data.begin() + (first + count) * width};
}

}  // namespace

TEST_CASE("prefill_layer: one chunk equals a cached prefix plus the rest", "[reference][layer]") {
  const AttentionConfig config = full_config();
  const LayerWeights weights = weights_for(config);
  constexpr int kTokens = 7;
  constexpr int kPrefix = 3;  // splits page 0 (positions 2, 3) between the two chunks
  const Tensor hidden = random_tensor({kTokens, config.hidden_size}, 20);
  // An image at positions 4, 5 of the second chunk; the prefix run cannot name it (it is past its end).
  const Spans whole_spans{{0, 1}, {{4, 6}}};

  PagedKvCache whole_cache = empty_cache(config);
  const LayerStages whole =
      prefill_layer(config, weights, hidden, chunk(0, kTokens), whole_spans, whole_cache);

  PagedKvCache split_cache = empty_cache(config);
  const Tensor first_hidden({kPrefix, config.hidden_size}, rows_of(hidden, 0, kPrefix));
  const Tensor rest_hidden({kTokens - kPrefix, config.hidden_size},
                           rows_of(hidden, kPrefix, kTokens - kPrefix));
  const LayerStages first = prefill_layer(config, weights, first_hidden, chunk(0, kPrefix), {}, split_cache);
  const LayerStages rest = prefill_layer(config, weights, rest_hidden, chunk(kPrefix, kTokens - kPrefix),
                                         whole_spans, split_cache);

  // Same stored inputs and the same summation order: bit-identical, not merely close.
  CHECK(first.output.data == rows_of(whole.output, 0, kPrefix));
  CHECK(rest.output.data == rows_of(whole.output, kPrefix, kTokens - kPrefix));
  CHECK(rest.k_final.data == rows_of(whole.k_final, kPrefix, kTokens - kPrefix));
  CHECK(rest.attention.data == rows_of(whole.attention, kPrefix, kTokens - kPrefix));
  CHECK(split_cache.key.data == whole_cache.key.data);
  CHECK(split_cache.value.data == whole_cache.value.data);
  // Page 1 and 3 are no sequence's: still the fill value.
  CHECK(whole_cache.key(1, 0, 0, 0) == -7.0);
  CHECK(whole_cache.value(3, 1, 0, 3) == -7.0);

  // The span matters: without it positions 4 and 5 attend differently (4 would not see 5).
  PagedKvCache no_span_cache = empty_cache(config);
  const LayerStages no_span = prefill_layer(config, weights, hidden, chunk(0, kTokens), {}, no_span_cache);
  CHECK(rows_of(no_span.attention, 4, 1) != rows_of(whole.attention, 4, 1));
  CHECK(rows_of(no_span.attention, 6, 1) ==
        rows_of(whole.attention, 6, 1));  // 6 is outside the span: same mask
}

TEST_CASE("prefill_layer: stages chain as the spec orders them", "[reference][layer]") {
  const AttentionConfig config = full_config();
  const LayerWeights weights = weights_for(config);
  const Tensor hidden = random_tensor({5, config.hidden_size}, 30);
  const Batch batch = chunk(0, 5);
  PagedKvCache cache = empty_cache(config);
  const LayerOptions unrounded{.round_between_stages = false};
  const LayerStages stages = prefill_layer(config, weights, hidden, batch, {}, cache, unrounded);

  using namespace attnplan::reference;
  const Tensor normed = rmsnorm(hidden, weights.input_norm, config.input_norm.epsilon);
  CHECK(stages.normed.data == normed.data);
  CHECK(stages.q.shape == std::vector<std::int64_t>{5, 2, 4});
  CHECK(stages.q.data == linear(normed, weights.q_proj, weights.q_bias).data);
  CHECK(stages.v.shape == std::vector<std::int64_t>{5, 1, 4});

  // Norm first (Gemma: 1 + w), then RoPE at positions 0..4.
  Tensor q_final = rmsnorm(stages.q, weights.q_norm, config.qkv_norm_epsilon(), 1.0);
  const std::vector<std::int64_t> positions{0, 1, 2, 3, 4};
  apply_rope(q_final, positions, config);
  CHECK(stages.q_final.data == q_final.data);
  CHECK(stages.v_final.data == rmsnorm(stages.v, {}, config.qkv_norm_epsilon()).data);

  // The cache holds k_final; attention over it and the output projection follow.
  CHECK(cache.key(4, 1, 0, 2) == stages.k_final(1, 0, 2));  // position 1: logical block 0 -> page 4, offset 1
  CHECK(stages.attention.shape == std::vector<std::int64_t>{5, 8});
  CHECK(stages.attention.data == attention(stages.q_final, cache, batch, {}, config, weights.sinks).data);
  CHECK(stages.output.data == linear(stages.attention, weights.o_proj, weights.o_bias).data);
}

TEST_CASE("prefill_layer rounds every stored stage to bf16 by default", "[reference][layer]") {
  const AttentionConfig config = full_config();
  const LayerWeights weights = weights_for(config);
  PagedKvCache cache = empty_cache(config);
  const LayerStages stages =
      prefill_layer(config, weights, random_tensor({3, config.hidden_size}, 40), chunk(0, 3), {}, cache);
  for (const Tensor* stage : {&stages.normed, &stages.q, &stages.k, &stages.v, &stages.q_final,
                              &stages.k_final, &stages.v_final, &stages.attention, &stages.output}) {
    CHECK(attnplan::reference::round_to_bf16(*stage).data == stage->data);
  }
}

TEST_CASE("prefill_layer checks its inputs before writing the cache", "[reference][layer]") {
  const AttentionConfig config = full_config();
  const Tensor hidden = random_tensor({2, config.hidden_size}, 50);
  const PagedKvCache untouched = empty_cache(config);

  const auto rejects = [&](const AttentionConfig& layer_config, const LayerWeights& weights,
                           const Batch& batch, const Spans& spans, const std::string& message) {
    PagedKvCache cache = untouched;
    const attnplan::Error error =
        expect_error([&] { prefill_layer(layer_config, weights, hidden, batch, spans, cache); });
    CHECK(error.stage() == Stage::input);
    CHECK(contains(error.message(), message));
    CHECK(cache.key.data == untouched.key.data);
    CHECK(cache.value.data == untouched.value.data);
  };

  LayerWeights no_bias = weights_for(config);
  no_bias.k_bias.clear();
  rejects(config, no_bias, chunk(0, 2), {}, "k_bias is missing but the config sets qkv_bias");

  AttentionConfig no_spans = config;
  no_spans.bidirectional_spans = false;
  rejects(no_spans, weights_for(config), chunk(0, 2), Spans{{0, 1}, {{0, 2}}}, "bidirectional_spans false");

  // A prefix page outside the cache: read only by attention, so found before the chunk is stored.
  Batch bad_prefix = chunk(2, 2);
  bad_prefix.block_tables[0] = kPages;
  rejects(config, weights_for(config), bad_prefix, {}, "block_tables[0][0]");

  rejects(config, weights_for(config), chunk(0, 3), {}, "query_starts[1] is 3 but the chunk has 2 tokens");
  rejects(config, weights_for(config), chunk(1, 2), Spans{{0, 1}, {{0, 2}}}, "straddles context_len 1");
}
