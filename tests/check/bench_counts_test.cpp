// The work counts behind `attnplan bench`'s TFLOP/s and GB/s: checked against brute force and hand counts.
#include "check/bench_counts.hpp"

#include <numeric>

#include "config/parse.hpp"
#include "core/error.hpp"
#include "support/catch.hpp"

namespace {

using attnplan::check::SequenceShape;

// Every (query, key) pair tested against spec section 6 one by one.
std::int64_t brute_force_pairs(const SequenceShape& sequence, int window) {
  std::int64_t pairs = 0;
  const int end = sequence.context_len + sequence.chunk_len;
  for (int query = sequence.context_len; query < end; ++query) {
    for (int key = 0; key < end; ++key) {
      bool allowed = key <= query && (window <= 0 || key > query - window);
      for (const auto& span : sequence.spans)
        allowed |= span[0] <= query && query < span[1] && span[0] <= key && key < span[1];
      pairs += allowed ? 1 : 0;
    }
  }
  return pairs;
}

attnplan::config::AttentionConfig load_plan(const std::string& name) {
  return attnplan::config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/" + name + ".json");
}

attnplan::config::AttentionConfig llama() {
  return load_plan("llama-3.1-8b");
}

}  // namespace

TEST_CASE("varlen_split: unequal lengths that sum to the tokens", "[check][bench]") {
  using attnplan::check::varlen_split;
  CHECK(varlen_split(4096, 1) == std::vector<int>{4096});
  CHECK(varlen_split(4096, 4) == std::vector<int>{409, 819, 1229, 1639});
  CHECK(varlen_split(10, 4) == std::vector<int>{1, 2, 3, 4});
  for (int tokens : {5, 7, 100, 1000, 16384}) {
    for (int seqs : {1, 2, 3, 5}) {
      if (seqs > tokens) continue;
      const std::vector<int> lengths = varlen_split(tokens, seqs);
      CHECK(std::accumulate(lengths.begin(), lengths.end(), 0) == tokens);
      for (int length : lengths) CHECK(length >= 1);
    }
  }
  const std::vector<int> tight = varlen_split(3, 3);
  CHECK(tight == std::vector<int>{1, 1, 1});
  CHECK_THROWS_AS(varlen_split(2, 3), attnplan::Error);
  CHECK_THROWS_AS(varlen_split(2, 0), attnplan::Error);
}

TEST_CASE("allowed_pairs: causal, window, prefix and spans against brute force", "[check][bench]") {
  using attnplan::check::allowed_pairs;
  // Causal over a fresh sequence: n (n + 1) / 2.
  CHECK(allowed_pairs({0, 4096, {}}, 0) == 4096LL * 4097 / 2);
  // A prefix: every query sees the whole prefix plus the causal part of the chunk.
  CHECK(allowed_pairs({100, 10, {}}, 0) == 10 * 100 + 55);
  // A window of W: the first W - 1 queries see fewer.
  CHECK(allowed_pairs({0, 10, {}}, 3) == 1 + 2 + 3 * 8);
  // One span over the whole chunk: bidirectional, n^2.
  CHECK(allowed_pairs({0, 64, {{0, 64}}}, 0) == 64 * 64);
  const std::vector<SequenceShape> shapes = {
      {0, 37, {}},        {5, 20, {}},       {0, 40, {{10, 20}}},          {8, 30, {{8, 16}, {20, 30}}},
      {0, 33, {{0, 33}}}, {12, 9, {{2, 6}}}, {3, 50, {{10, 25}, {30, 31}}}};
  for (const SequenceShape& shape : shapes) {
    for (int window : {0, 1, 4, 16}) {
      INFO("context " << shape.context_len << " chunk " << shape.chunk_len << " window " << window);
      CHECK(allowed_pairs(shape, window) == brute_force_pairs(shape, window));
    }
  }
}

TEST_CASE("stage_work: GEMM FLOPs 2 M N K, attention 2 (D + Dv) per allowed pair and head",
          "[check][bench]") {
  using attnplan::plan::StageKind;
  const attnplan::config::AttentionConfig config = llama();  // 4096, 32/8, D 128, RoPE, no q/k norm
  const std::vector<attnplan::check::StageWork> work = attnplan::check::stage_work(config, {{0, 8192, {}}});
  REQUIRE(work.size() == 6);
  CHECK(work[0].stage == StageKind::input_norm);
  CHECK(work[0].flops == 0);
  CHECK(work[0].bytes == 8192.0 * 4096 * 4 + 4096 * 2);
  CHECK(work[1].stage == StageKind::qkv_projection);
  CHECK(work[1].flops == 2.0 * 8192 * 6144 * 4096);
  CHECK(work[1].bytes == (8192.0 * 4096 + 6144.0 * 4096 + 8192.0 * 6144) * 2);
  CHECK(work[2].stage == StageKind::qkv_postprocess);
  CHECK(work[2].bytes == 8192.0 * (4096 + 1024) * 4);  // RoPE rewrites q and k: read + write
  CHECK(work[3].stage == StageKind::kv_store);
  CHECK(work[3].bytes == 8192.0 * 2048 * 4);
  CHECK(work[4].stage == StageKind::attention);
  CHECK(work[4].flops == 2.0 * 256 * 32 * (8192.0 * 8193 / 2));
  CHECK(work[5].stage == StageKind::output_projection);
  CHECK(work[5].flops == 2.0 * 8192 * 4096 * 4096);

  // No RoPE and no norms: no postprocess stage, as the plan has none.
  attnplan::config::AttentionConfig plain = config;
  plain.rotary.dim = 0;
  const auto without = attnplan::check::stage_work(plain, {{0, 16, {}}, {3, 16, {}}});
  REQUIRE(without.size() == 5);
  CHECK(without[2].stage == StageKind::kv_store);
  CHECK(without[3].flops == 2.0 * 256 * 32 * (136 + (16 * 3 + 136)));
}

TEST_CASE("stage_work: fp8 activations, codes from the norm for q|k|v and a quantize stage before o",
          "[check][bench][fp8_activation]") {
  using attnplan::plan::StageKind;
  // Both plans: 4096 wide, 32/8 heads, D 128. Activation scales as the weights' granularity asks
  // (config::fp8_activation_scales): per token and 128 channels for block scales, per token for channel.
  struct Row {
    const char* plan;
    double scales_per_token;
  };
  for (const Row row : {Row{"qwen3-8b-fp8-block-fp8act", 4096 / 128}, Row{"llama-3.1-8b-fp8-dynamic", 1}}) {
    INFO(row.plan);
    const std::vector<attnplan::check::StageWork> work =
        attnplan::check::stage_work(load_plan(row.plan), {{0, 1000, {}}});
    REQUIRE(work.size() == 7);
    // The norm: bf16 read, e4m3 written, the f32 scales (and the weight).
    CHECK(work[0].stage == StageKind::input_norm);
    CHECK(work[0].bytes == 1000.0 * 4096 * 3 + 1000.0 * row.scales_per_token * 4 + 4096 * 2);
    CHECK(work[1].stage == StageKind::qkv_projection);
    CHECK(work[1].flops == 2.0 * 1000 * 6144 * 4096);
    CHECK(work[5].stage == StageKind::output_quantize);
    CHECK(work[5].flops == 0);
    CHECK(work[5].bytes == 1000.0 * 4096 * 3 + 1000.0 * row.scales_per_token * 4);
    CHECK(work[6].stage == StageKind::output_projection);
    CHECK(work[6].flops == 2.0 * 1000 * 4096 * 4096);
  }
}

TEST_CASE("spread and rotation_sets", "[check][bench]") {
  using attnplan::check::rotation_sets;
  using attnplan::check::spread;
  const auto odd = spread({3, 1, 2});
  CHECK(odd.median == 2);
  CHECK(odd.min == 1);
  CHECK(odd.max == 3);
  CHECK(spread({4, 1, 2, 3}).median == 2.5);
  CHECK_THROWS_AS(spread({}), attnplan::Error);
  constexpr std::size_t MB = 1000 * 1000, GB = 1000 * MB;
  CHECK(rotation_sets(10 * MB, 50 * MB, 100 * GB) == 10);  // twice the L2
  CHECK(rotation_sets(500 * MB, 50 * MB, 100 * GB) == 2);  // at least two
  CHECK(rotation_sets(1, 50 * MB, 100 * GB) == 64);        // at most 64
  CHECK(rotation_sets(10 * MB, 50 * MB, 50 * MB) == 2);    // half the free memory
  CHECK(rotation_sets(10 * GB, 50 * MB, 12 * GB) == 1);    // one set fits: still measure
}
