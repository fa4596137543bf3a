// The paged KV store against the reference (spec section 5): every slot of the chunk holds exactly its
// token's k and v bits, and every other slot of the pool is untouched. With an fp8 e4m3fn cache, every
// slot of the chunk holds exactly the reference's codes (core::quantize_kv_fp8: same fp32 division, same
// rounding), byte for byte.
#include <algorithm>
#include <numeric>
#include <optional>

#include "core/bf16.hpp"
#include "core/fp8.hpp"
#include "driver/cuda_api.hpp"
#include "driver/memory.hpp"
#include "driver/stream.hpp"
#include "gpu_support.hpp"
#include "reference/kv_store.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::gpu_testing;

namespace {

struct Shape {
  int kv_heads;
  int head_dim;
  int value_head_dim;
  int block_size;
};

struct Sequence {
  int context_len;  // tokens already cached
  int chunk_len;    // tokens in this chunk
};

// A batch over a shuffled page pool, one page list per sequence, plus a few spare pages that no
// sequence owns (they must stay untouched).
struct Workload {
  reference::Batch batch;
  int num_tokens = 0;
  int num_blocks = 0;
};

Workload make_workload(const std::vector<Sequence>& sequences, int block_size, std::mt19937_64& rng) {
  Workload work;
  int max_blocks = 1;
  for (const Sequence& s : sequences)
    max_blocks = std::max(max_blocks, (s.context_len + s.chunk_len + block_size - 1) / block_size);
  work.batch.max_blocks_per_seq = max_blocks;
  work.num_blocks = int(sequences.size()) * max_blocks + 3;
  std::vector<int> pages(work.num_blocks);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  work.batch.query_starts.push_back(0);
  std::size_t next_page = 0;
  for (const Sequence& s : sequences) {
    work.batch.context_lens.push_back(s.context_len);
    work.num_tokens += s.chunk_len;
    work.batch.query_starts.push_back(work.num_tokens);
    for (int b = 0; b < max_blocks; ++b) work.batch.block_tables.push_back(pages[next_page++]);
  }
  return work;
}

struct DeviceBatch {
  driver::DeviceBuffer query_starts, context_lens, block_tables;
  explicit DeviceBatch(const reference::Batch& batch)
      : query_starts(driver::DeviceBuffer::from_host(batch.query_starts)),
        context_lens(driver::DeviceBuffer::from_host(batch.context_lens)),
        block_tables(driver::DeviceBuffer::from_host(batch.block_tables)) {}
  plan::BatchDescription describe(const Workload& work) const {
    plan::BatchDescription batch;
    batch.num_seqs = work.batch.num_seqs();
    batch.num_tokens = work.num_tokens;
    batch.query_starts = query_starts.data<const int>();
    batch.context_lens = context_lens.data<const int>();
    batch.block_tables = block_tables.data<const int>();
    batch.max_blocks_per_seq = work.batch.max_blocks_per_seq;
    return batch;
  }
};

// Runs the kernel on poisoned pages and compares every element of both pools with the reference's
// expectation: the token's bits in its slot, poison everywhere else. `row_padding` puts k and v inside
// wider rows (as a fused QKV output would) to exercise the row strides.
void check_kv_store(const Shape& shape, const std::vector<Sequence>& sequences, int row_padding,
                    std::uint64_t seed, std::optional<reference::KvFp8Scales> fp8 = std::nullopt) {
  INFO("kv_heads " << shape.kv_heads << ", head_dim " << shape.head_dim << "/" << shape.value_head_dim
                   << ", block " << shape.block_size << ", seqs " << sequences.size() << ", padding "
                   << row_padding << (fp8 ? ", fp8 cache" : ""));
  config::AttentionConfig config =
      make_config(shape.kv_heads * shape.head_dim, shape.kv_heads, shape.kv_heads, shape.head_dim,
                  shape.value_head_dim, shape.block_size);
  if (fp8) {
    config.kv_cache.dtype = config::KvCacheDtype::fp8_e4m3;
    config.kv_cache.k_scale = fp8->k_scale;
    config.kv_cache.v_scale = fp8->v_scale;
  }
  plan::PrefillPlan plan = gpu().load(config);
  std::mt19937_64 rng(seed);
  const Workload work = make_workload(sequences, shape.block_size, rng);
  const long long key_width = (long long)shape.kv_heads * shape.head_dim;
  const long long value_width = (long long)shape.kv_heads * shape.value_head_dim;
  const long long key_stride = key_width + row_padding;
  const long long value_stride = value_width + row_padding;

  const std::vector<std::uint16_t> key_rows = random_bf16(std::size_t(work.num_tokens) * key_stride, rng);
  const std::vector<std::uint16_t> value_rows = random_bf16(std::size_t(work.num_tokens) * value_stride, rng);

  // The reference on the dense k and v, into caches poisoned with NaN, gives the expected slots.
  reference::Tensor key({work.num_tokens, shape.kv_heads, shape.head_dim});
  reference::Tensor value({work.num_tokens, shape.kv_heads, shape.value_head_dim});
  for (int t = 0; t < work.num_tokens; ++t) {
    for (long long i = 0; i < key_width; ++i)
      key.data[t * key_width + i] = core::bf16_to_float(key_rows[t * key_stride + i]);
    for (long long i = 0; i < value_width; ++i) {
      value.data[t * value_width + i] = core::bf16_to_float(value_rows[t * value_stride + i]);
    }
  }
  reference::PagedKvCache expected = reference::PagedKvCache::filled(
      work.num_blocks, shape.block_size, shape.kv_heads, shape.head_dim, shape.value_head_dim, std::nan(""));
  expected.fp8 = fp8;
  const std::vector<std::int64_t> slots = reference::kv_store(key, value, work.batch, expected);
  REQUIRE(slots.size() == std::size_t(work.num_tokens));

  const std::size_t key_pool = std::size_t(work.num_blocks) * shape.block_size * key_width;
  const std::size_t value_pool = std::size_t(work.num_blocks) * shape.block_size * value_width;
  driver::DeviceBuffer d_key = driver::DeviceBuffer::from_host(key_rows);
  driver::DeviceBuffer d_value = driver::DeviceBuffer::from_host(value_rows);
  const std::size_t element_bytes = fp8 ? 1 : 2;
  driver::DeviceBuffer d_key_cache(key_pool * element_bytes), d_value_cache(value_pool * element_bytes);
  driver::Stream stream = driver::Stream::create();
  d_key_cache.fill_bytes_async(kPoisonByte, stream.handle());
  d_value_cache.fill_bytes_async(kPoisonByte, stream.handle());
  DeviceBatch d_batch(work.batch);

  plan::KvStoreArgs args;
  args.key = d_key.data<const void>();
  args.value = d_value.data<const void>();
  args.key_row_stride = key_stride;
  args.value_row_stride = value_stride;
  args.cache = {d_key_cache.data<void>(), d_value_cache.data<void>(), work.num_blocks};
  if (fp8) {
    args.cache.k_scale = fp8->k_scale;
    args.cache.v_scale = fp8->v_scale;
  }
  args.batch = d_batch.describe(work);
  gpu().context.synchronize();  // uploads from pageable memory may still be in flight on the legacy stream
  plan.launch_kv_store(args, stream.handle());
  stream.synchronize();

  if (fp8) {
    // The expected pools: 0xFF (poison, a NaN code the store never writes from finite input) except the
    // chunk's slots, which hold the reference's codes of the token's row; and the reference's cache holds
    // exactly those codes times the scale.
    auto expected_codes = [&](const reference::Tensor& rows, long long width, std::size_t pool, float scale,
                              const reference::Tensor& dequantized) {
      std::vector<std::uint8_t> codes(pool, kPoisonByte);
      std::size_t inconsistent = 0;
      for (int t = 0; t < work.num_tokens; ++t) {
        for (long long i = 0; i < width; ++i) {
          const std::size_t at = std::size_t(slots[std::size_t(t)] * width + i);
          codes[at] = core::quantize_kv_fp8(static_cast<float>(rows.data[std::size_t(t * width + i)]), scale);
          inconsistent += dequantized.data[at] != core::fp8_e4m3_to_double(codes[at]) * scale;
        }
      }
      CHECK(inconsistent == 0);
      return codes;
    };
    auto mismatches = [](const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want) {
      std::size_t count = 0;
      for (std::size_t i = 0; i < got.size(); ++i) count += got[i] != want[i];
      return count;
    };
    CHECK(mismatches(d_key_cache.download_all<std::uint8_t>(),
                     expected_codes(key, key_width, key_pool, fp8->k_scale, expected.key)) == 0);
    CHECK(mismatches(d_value_cache.download_all<std::uint8_t>(),
                     expected_codes(value, value_width, value_pool, fp8->v_scale, expected.value)) == 0);
    return;
  }

  auto compare = [](const std::vector<std::uint16_t>& got, const reference::Tensor& want) {
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double expected_value = want.data[i];
      const bool ok =
          std::isnan(expected_value) ? got[i] == kPoisonBits : core::bf16_to_float(got[i]) == expected_value;
      mismatches += !ok;
    }
    return mismatches;
  };
  CHECK(compare(d_key_cache.download_all<std::uint16_t>(), expected.key) == 0);
  CHECK(compare(d_value_cache.download_all<std::uint16_t>(), expected.value) == 0);
}

}  // namespace

TEST_CASE("paged KV store writes exactly the chunk's slots", "[gpu][kv_store]") {
  // Several sequences of different lengths and prefixes; chunks that start mid-page and cross pages.
  const std::vector<Sequence> mixed = {{0, 37}, {5, 1}, {100, 64}, {16, 15}, {0, 1}, {250, 130}};
  check_kv_store({8, 128, 128, 16}, mixed, 0, 11);          // Llama / Qwen shape
  check_kv_store({8, 128, 128, 16}, mixed, 32 * 128, 12);   // k, v inside fused-QKV-wide rows
  check_kv_store({1, 64, 64, 32}, mixed, 0, 13);            // MQA
  check_kv_store({4, 256, 128, 64}, mixed, 8, 14);          // value head dim != head dim
  check_kv_store({2, 80, 80, 1}, {{3, 9}, {0, 4}}, 0, 15);  // one token per page, 80-wide heads
  check_kv_store({8, 64, 64, 16}, {{0, 2000}}, 0, 16);      // one long sequence
}

TEST_CASE("fp8 KV store writes the reference's e4m3fn codes into exactly the chunk's slots",
          "[gpu][kv_store][fp8kv]") {
  const std::vector<Sequence> mixed = {{0, 37}, {5, 1}, {100, 64}, {16, 15}, {0, 1}, {250, 130}};
  // Scales that put the N(0, 1) inputs across the normal range, saturate the tails (k_scale 0.005: |k| >
  // 2.24 clamps to 448) and reach deep into the subnormals (v_scale 64: |v| < 1 lands below 2^-6), so the
  // normal, subnormal, tie and saturation paths of the device conversion all meet the host's.
  check_kv_store({8, 128, 128, 16}, mixed, 0, 21, reference::KvFp8Scales{0.0421f, 0.0173f});
  check_kv_store({8, 128, 128, 16}, mixed, 32 * 128, 22, reference::KvFp8Scales{0.005f, 64.0f});
  check_kv_store({4, 256, 128, 64}, mixed, 8, 23, reference::KvFp8Scales{1.0f, 1.0f});
  check_kv_store({2, 80, 40, 1}, {{3, 9}, {0, 4}}, 0, 24, reference::KvFp8Scales{0.3f, 3.0f});  // Dv 40
}

TEST_CASE("a block table entry outside the pool writes nothing", "[gpu][kv_store]") {
  // The host cannot see device block tables without synchronizing; the kernel skips such pages so no slot
  // outside the chunk's own can ever change.
  const Shape shape{2, 64, 64, 16};
  plan::PrefillPlan plan = gpu().load(make_config(128, 2, 2, 64, 64, 16));
  std::mt19937_64 rng(21);
  Workload work = make_workload({{0, 20}}, shape.block_size, rng);
  work.batch.block_tables[1] = work.num_blocks + 5;  // the second page of the only sequence is bogus
  const int first_page = work.batch.block_tables[0];

  const std::vector<std::uint16_t> key_rows = random_bf16(std::size_t(work.num_tokens) * 128, rng);
  driver::DeviceBuffer d_key = driver::DeviceBuffer::from_host(key_rows);
  const std::size_t pool = std::size_t(work.num_blocks) * shape.block_size * 128;
  driver::DeviceBuffer d_key_cache(pool * 2), d_value_cache(pool * 2);
  d_key_cache.fill_bytes(kPoisonByte);
  d_value_cache.fill_bytes(kPoisonByte);
  DeviceBatch d_batch(work.batch);
  plan::KvStoreArgs args;
  args.key = d_key.data<const void>();
  args.value = d_key.data<const void>();
  args.cache = {d_key_cache.data<void>(), d_value_cache.data<void>(), work.num_blocks};
  args.batch = d_batch.describe(work);
  plan.launch_kv_store(args, nullptr);
  driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");

  const std::vector<std::uint16_t> cache = d_key_cache.download_all<std::uint16_t>();
  std::size_t written = 0;
  for (std::size_t i = 0; i < cache.size(); ++i) {
    const std::size_t page = i / (shape.block_size * 128);
    if (cache[i] != kPoisonBits) {
      ++written;
      CHECK(page == std::size_t(first_page));
    }
  }
  CHECK(written == std::size_t(16) * 128);  // the first page's 16 tokens, nothing of the bogus one
}

TEST_CASE("KV store rejects batches that contradict the plan before launching", "[gpu][kv_store]") {
  plan::PrefillPlan plan = gpu().load(make_config(1024, 8, 8, 128, 128, 16));
  driver::DeviceBuffer buffer(1 << 20);
  buffer.fill_bytes(0);  // one sequence of 4 tokens at position 0, all in page 0
  plan::KvStoreArgs args;
  args.key = args.value = buffer.data<const void>();
  args.cache = {buffer.data<void>(), buffer.data<void>(), 4};
  args.batch.num_seqs = 1;
  args.batch.num_tokens = 4;
  args.batch.max_blocks_per_seq = 1;
  args.batch.query_starts = args.batch.context_lens = args.batch.block_tables = buffer.data<const int>();
  plan.launch_kv_store(args, nullptr);  // well-formed arguments launch
  driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");

  auto rejected = [&](auto mutate) {
    plan::KvStoreArgs bad = args;
    mutate(bad);
    CHECK_THROWS_AS(plan.launch_kv_store(bad, nullptr), Error);
  };
  rejected([&](plan::KvStoreArgs& a) { a.batch.num_tokens = plan.compiled().config.max_tokens + 1; });
  rejected([](plan::KvStoreArgs& a) { a.batch.num_seqs = 0; });
  rejected([](plan::KvStoreArgs& a) { a.batch.max_blocks_per_seq = 0; });
  rejected([](plan::KvStoreArgs& a) { a.batch.block_tables = nullptr; });
  rejected([](plan::KvStoreArgs& a) { a.cache.num_blocks = 0; });
  rejected([](plan::KvStoreArgs& a) { a.key_row_stride = 1000; });  // narrower than kv_heads * head_dim
  rejected([](plan::KvStoreArgs& a) { a.key_row_stride = 1027; });  // breaks 16-byte rows
  rejected([&](plan::KvStoreArgs& a) { a.cache.key_cache = static_cast<char*>(buffer.data<void>()) + 2; });
}
