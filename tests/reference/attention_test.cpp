// attention() (spec section 6) on cases small enough to work out by hand. The mask tests use zero keys,
// so every allowed key gets the same weight, and one-hot values (v of position p is e_p), so the output
// row of a query is 1/|allowed| at exactly the positions it may see.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "layer_testing.hpp"
#include "reference/layer.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using attnplan::Stage;
using attnplan::config::AttentionConfig;
using attnplan::reference::attention;
using attnplan::reference::attention_rows;
using attnplan::reference::Batch;
using attnplan::reference::kv_store;
using attnplan::reference::PagedKvCache;
using attnplan::reference::Spans;
using attnplan::reference::Tensor;
using attnplan::reference::testing::one_sequence;
using attnplan::reference::testing::small_config;

namespace {

constexpr int kBlockSize = 2;

// Stores k and v (this chunk, per `batch`) into a fresh cache and attends with q.
Tensor attend(const AttentionConfig& config, const Tensor& q, const Tensor& k, const Tensor& v,
              const Batch& batch, const Spans& spans = {}, const std::vector<double>& sinks = {}) {
  PagedKvCache cache = PagedKvCache::filled(16, kBlockSize, static_cast<int>(k.extent(1)),
                                            static_cast<int>(k.extent(2)), static_cast<int>(v.extent(2)));
  kv_store(k, v, batch, cache);
  return attention(q, cache, batch, spans, config, sinks);
}

// Positions seen by query row `row` (head 0) under zero keys and one-hot values; checks the weights are
// equal.
std::vector<int> seen(const Tensor& out, std::int64_t row) {
  std::vector<int> positions;
  for (std::int64_t p = 0; p < out.extent(2); ++p)
    if (out(row, 0, p) != 0.0) positions.push_back(static_cast<int>(p));
  for (int p : positions) CHECK(out(row, 0, p) == Approx(1.0 / static_cast<double>(positions.size())));
  return positions;
}

// The mask of one sequence of `tokens` tokens with no prefix: row i is the positions query i sees.
std::vector<std::vector<int>> mask_of(const AttentionConfig& config, int tokens, const Spans& spans = {}) {
  const Tensor q({tokens, 1, 2});  // zero: every score is 0
  const Tensor k({tokens, 1, 2});
  Tensor v({tokens, 1, tokens});
  for (int p = 0; p < tokens; ++p) v(p, 0, p) = 1.0;
  const Tensor out = attend(config, q, k, v, one_sequence(tokens, kBlockSize), spans);
  std::vector<std::vector<int>> mask;
  for (int i = 0; i < tokens; ++i) mask.push_back(seen(out, i));
  return mask;
}

using Mask = std::vector<std::vector<int>>;

}  // namespace

TEST_CASE("attention causal mask: query i sees 0..i", "[reference][attention]") {
  const Mask mask = mask_of(small_config(1, 1, 2, 6), 6);
  CHECK(mask == Mask{{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4, 5}});
}

TEST_CASE("attention sliding window W: W keys including the query's own", "[reference][attention]") {
  AttentionConfig config = small_config(1, 1, 2, 6);
  config.sliding_window = 2;  // pk > pq - 2: query at 5 sees 4 and 5 only
  CHECK(mask_of(config, 6) == Mask{{0}, {0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}});
  config.sliding_window = 1;  // itself only
  CHECK(mask_of(config, 3) == Mask{{0}, {1}, {2}});
}

TEST_CASE("attention bidirectional span: tokens inside see the whole span, others stay causal",
          "[reference][attention]") {
  AttentionConfig config = small_config(1, 1, 2, 8);
  config.bidirectional_spans = true;
  const Spans spans{{0, 1}, {{2, 5}}};  // one image at positions 2, 3, 4
  CHECK(mask_of(config, 8, spans) == Mask{{0},
                                          {0, 1},           // before the span: causal, no look-ahead
                                          {0, 1, 2, 3, 4},  // inside: later span tokens too
                                          {0, 1, 2, 3, 4},
                                          {0, 1, 2, 3, 4},
                                          {0, 1, 2, 3, 4, 5},  // after: plain causal
                                          {0, 1, 2, 3, 4, 5, 6},
                                          {0, 1, 2, 3, 4, 5, 6, 7}});

  // With a window of 2 the span only adds its own tokens: query 2 keeps its window {1, 2} plus {2, 3, 4};
  // a query after the span does not see the span's early tokens through it (both must be in the span).
  config.sliding_window = 2;
  CHECK(mask_of(config, 8, spans) ==
        Mask{{0}, {0, 1}, {1, 2, 3, 4}, {2, 3, 4}, {2, 3, 4}, {4, 5}, {5, 6}, {6, 7}});
}

TEST_CASE("attention rejects spans when the config does not accept them", "[reference][attention]") {
  const AttentionConfig config = small_config(1, 1, 2, 4);  // bidirectional_spans false
  const Spans spans{{0, 1}, {{0, 2}}};
  const attnplan::Error error = expect_error([&] { mask_of(config, 4, spans); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), "bidirectional_spans"));
}

TEST_CASE("attention scale multiplies q.k: weights softmax(scale q.k)", "[reference][attention]") {
  AttentionConfig config = small_config(1, 1, 1, 1);
  config.attention_scale = 0.5;
  // Keys 1 and 0, q = 2: scores 1 and 0 for the query at position 1. Values 1 and 0.
  const Tensor q({2, 1, 1}, {2.0, 2.0});
  const Tensor k({2, 1, 1}, {1.0, 0.0});
  const Tensor v({2, 1, 1}, {1.0, 0.0});
  const Tensor out = attend(config, q, k, v, one_sequence(2, kBlockSize));
  CHECK(out(0, 0, 0) == 1.0);                                            // sees only itself
  CHECK(out(1, 0, 0) == Approx(std::exp(1.0) / (std::exp(1.0) + 1.0)));  // 0.731059
}

TEST_CASE("attention sinks join the denominator only, unscaled", "[reference][attention]") {
  AttentionConfig config = small_config(1, 1, 1, 1);
  config.attention_scale = 0.5;
  config.sinks = true;
  // One key: x = 0.5 * 1 * 1 = 0.5; S = 1 used as is. out = v e^x / (e^x + e^S).
  const Tensor q({1, 1, 1}, {1.0});
  const Tensor k({1, 1, 1}, {1.0});
  const Tensor v({1, 1, 1}, {3.0});
  const Tensor out = attend(config, q, k, v, one_sequence(1, kBlockSize), {}, {1.0});
  CHECK(out(0, 0, 0) == Approx(3.0 * std::exp(0.5) / (std::exp(0.5) + std::exp(1.0))));  // 1.13262
  CHECK(out(0, 0, 0) == Approx(1.1326220));

  // A very negative sink vanishes; a very large one takes all the weight (stable through m = max).
  CHECK(attend(config, q, k, v, one_sequence(1, kBlockSize), {}, {-1000.0})(0, 0, 0) == Approx(3.0));
  CHECK(attend(config, q, k, v, one_sequence(1, kBlockSize), {}, {1000.0})(0, 0, 0) ==
        Approx(0.0).margin(1e-300));

  // The sink count must match the query heads, and sinks need the config's flag.
  CHECK(expect_error([&] { attend(config, q, k, v, one_sequence(1, kBlockSize)); }).stage() == Stage::input);
  config.sinks = false;
  CHECK(expect_error([&] { attend(config, q, k, v, one_sequence(1, kBlockSize), {}, {1.0}); }).stage() ==
        Stage::input);
}

TEST_CASE("attention softcap: c tanh(score / c) before the softmax", "[reference][attention]") {
  AttentionConfig config = small_config(1, 1, 1, 1);
  config.attention_scale = 1.0;
  config.softcap = 2.0;
  // Query at position 1 with q = 2: keys 2 (score 4, capped 2 tanh 2 = 1.92806) and 0 (score 0).
  const Tensor q({2, 1, 1}, {2.0, 2.0});
  const Tensor k({2, 1, 1}, {2.0, 0.0});
  const Tensor v({2, 1, 1}, {1.0, 0.0});
  const Tensor out = attend(config, q, k, v, one_sequence(2, kBlockSize));
  const double capped = 2.0 * std::tanh(2.0);
  CHECK(out(1, 0, 0) == Approx(std::exp(capped) / (std::exp(capped) + 1.0)));  // 0.87303, not e^4/(e^4+1)
  CHECK(out(1, 0, 0) == Approx(0.8730340));
}

TEST_CASE("attention GQA: query head h reads kv head h / (Hq / Hkv); Dv != D", "[reference][attention]") {
  const AttentionConfig config = small_config(4, 2, 2, 3);
  // One token: each query head's output is its kv head's value exactly.
  const Tensor q({1, 4, 2}, {1.0, 0.0, 0.0, 1.0, -1.0, 2.0, 0.5, 0.5});
  const Tensor k({1, 2, 2}, {1.0, 2.0, 3.0, 4.0});
  const Tensor v({1, 2, 3}, {10.0, 11.0, 12.0,  //
                             20.0, 21.0, 22.0});
  const Tensor out = attend(config, q, k, v, one_sequence(1, kBlockSize));
  REQUIRE(out.shape == std::vector<std::int64_t>{1, 4, 3});
  CHECK(out.data == std::vector<double>{10, 11, 12, 10, 11, 12, 20, 21, 22, 20, 21, 22});

  // Two tokens: query head 2 (kv head 1) weighs kv head 1's keys; head 0 those of kv head 0.
  const Tensor q2({2, 4, 2}, std::vector<double>(16, 1.0));
  const Tensor k2({2, 2, 2}, {0.0, 0.0, 0.0, 0.0,      // position 0: both kv heads score 0
                              1.0, 1.0, -1.0, -1.0});  // position 1: kv head 0 scores 2, kv head 1 scores -2
  const Tensor v2({2, 2, 3}, {0, 0, 0, 0, 0, 0,        //
                              1, 1, 1, 1, 1, 1});
  const Tensor out2 = attend(config, q2, k2, v2, one_sequence(2, kBlockSize));
  const double scale = 1.0 / std::sqrt(2.0);
  CHECK(out2(1, 0, 0) == Approx(std::exp(2.0 * scale) / (std::exp(2.0 * scale) + 1.0)));
  CHECK(out2(1, 1, 2) == Approx(std::exp(2.0 * scale) / (std::exp(2.0 * scale) + 1.0)));
  CHECK(out2(1, 2, 0) == Approx(std::exp(-2.0 * scale) / (std::exp(-2.0 * scale) + 1.0)));
  CHECK(out2(1, 3, 1) == Approx(std::exp(-2.0 * scale) / (std::exp(-2.0 * scale) + 1.0)));
}

TEST_CASE("attention reads the cached prefix through scattered block tables, per sequence",
          "[reference][attention]") {
  // Two sequences with prefixes already cached; one-hot values over the cache's own layout tell which
  // positions each query sees. Block size 2, pages handed out out of order.
  const AttentionConfig config = small_config(1, 1, 2, 12);
  Batch batch;
  batch.query_starts = {0, 2, 3};
  batch.context_lens = {3, 1};  // s0: positions 3, 4 in the chunk; s1: position 1
  batch.max_blocks_per_seq = 3;
  batch.block_tables = {5, 2, 7,  //
                        0, 4, 1};
  PagedKvCache cache = PagedKvCache::filled(8, kBlockSize, 1, 2, 12);
  // Prefix: s0 positions 0..2 with one-hot v = e_0, e_1, e_2; s1 position 0 with e_5.
  Batch prefix = batch;
  prefix.query_starts = {0, 3, 4};
  prefix.context_lens = {0, 0};
  Tensor prefix_v({4, 1, 12});
  prefix_v(0, 0, 0) = prefix_v(1, 0, 1) = prefix_v(2, 0, 2) = prefix_v(3, 0, 5) = 1.0;
  kv_store(Tensor({4, 1, 2}), prefix_v, prefix, cache);
  // Chunk: s0 positions 3, 4 -> e_3, e_4; s1 position 1 -> e_6.
  Tensor chunk_v({3, 1, 12});
  chunk_v(0, 0, 3) = chunk_v(1, 0, 4) = chunk_v(2, 0, 6) = 1.0;
  kv_store(Tensor({3, 1, 2}), chunk_v, batch, cache);

  const Tensor out = attention(Tensor({3, 1, 2}), cache, batch, {}, config, {});
  CHECK(seen(out, 0) == std::vector<int>{0, 1, 2, 3});
  CHECK(seen(out, 1) == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(seen(out, 2) == std::vector<int>{5, 6});  // never sequence 0's keys
}

TEST_CASE("attention rejects shapes that disagree", "[reference][attention]") {
  const AttentionConfig config = small_config(3, 2, 2, 2);
  PagedKvCache cache = PagedKvCache::filled(4, kBlockSize, 2, 2, 2);
  // 3 query heads over 2 kv heads
  CHECK(expect_error([&] {
          attention(Tensor({1, 3, 2}), cache, one_sequence(1, kBlockSize), {}, config, {});
        }).stage() == Stage::input);
  // head_dim 4 against cached keys of 2
  CHECK(expect_error([&] {
          attention(Tensor({1, 2, 4}), cache, one_sequence(1, kBlockSize), {}, config, {});
        }).stage() == Stage::input);
}

TEST_CASE("attention_rows equals attention() on the rows it is given, in their order",
          "[reference][attention]") {
  // Two sequences with cached prefixes, scattered pages, GQA, Dv != D, a window, a softcap, a span in each
  // chunk and sinks: every rule that depends on the row's sequence and position.
  AttentionConfig config = small_config(4, 2, 3, 5);
  config.sliding_window = 4;
  config.softcap = 2.0;
  config.bidirectional_spans = true;
  config.sinks = true;
  Batch batch;
  batch.query_starts = {0, 6, 9};
  batch.context_lens = {2, 3};
  batch.max_blocks_per_seq = 4;
  batch.block_tables = {7, 1, 4, 0,  //
                        2, 6, 3, 5};
  Spans spans;
  spans.offsets = {0, 1, 2};
  spans.bounds = {{3, 6}, {4, 6}};
  const std::vector<double> sinks = {0.5, -1.0, 0.0, 2.0};
  std::mt19937_64 random(7);
  std::normal_distribution<double> normal;
  auto random_tensor = [&](std::vector<std::int64_t> shape) {
    Tensor tensor(std::move(shape));
    for (double& x : tensor.data) x = normal(random);
    return tensor;
  };
  PagedKvCache cache = PagedKvCache::filled(8, kBlockSize, 2, 3, 5);
  Batch prefix = batch;  // the prefixes, stored as a chunk of their own
  prefix.query_starts = {0, 2, 5};
  prefix.context_lens = {0, 0};
  kv_store(random_tensor({5, 2, 3}), random_tensor({5, 2, 5}), prefix, cache);
  kv_store(random_tensor({9, 2, 3}), random_tensor({9, 2, 5}), batch, cache);
  const Tensor q = random_tensor({9, 4, 3});
  const Tensor all = attention(q, cache, batch, spans, config, sinks);

  const std::vector<std::int64_t> rows = {8, 0, 4, 4, 6};
  Tensor q_rows({5, 4, 3});
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t d = 0; d < 3; ++d) q_rows(std::int64_t(i), h, d) = q(rows[i], h, d);
  const Tensor some = attention_rows(q_rows, rows, 9, cache, batch, spans, config, sinks);
  REQUIRE(some.shape == std::vector<std::int64_t>{5, 4, 5});
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t d = 0; d < 5; ++d) CHECK(some(std::int64_t(i), h, d) == all(rows[i], h, d));

  // A row outside the chunk, or queries for a different number of rows: Error(input).
  const std::vector<std::int64_t> outside = {9};
  CHECK(expect_error([&] {
          attention_rows(Tensor({1, 4, 3}), outside, 9, cache, batch, spans, config, sinks);
        }).stage() == Stage::input);
  CHECK(expect_error([&] {
          attention_rows(Tensor({2, 4, 3}), std::vector<std::int64_t>{1}, 9, cache, batch, spans, config,
                         sinks);
        }).stage() == Stage::input);
}
