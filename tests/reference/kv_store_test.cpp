// Paged KV store against slots worked out by hand (spec section 5):
//   slot = block_tables[s][p / block_size] * block_size + p % block_size, p = context_len + i.
#include "reference/kv_store.hpp"

#include <cstdint>
#include <vector>

#include "support/expect_error.hpp"
#include "support/catch.hpp"

using attnplan::Stage;
using attnplan::reference::Batch;
using attnplan::reference::kv_store;
using attnplan::reference::PagedKvCache;
using attnplan::reference::Tensor;

namespace {

constexpr double kUnwritten = -999.0;

// k[t][h][d] = 1000 t + 10 h + d and v = -(that), so every element says where it came from.
Tensor rows(std::int64_t tokens, int kv_heads, int dim, double sign) {
  Tensor tensor({tokens, kv_heads, dim});
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < kv_heads; ++h)
      for (int d = 0; d < dim; ++d) tensor(t, h, d) = sign * (1000.0 * double(t) + 10.0 * h + d);
  return tensor;
}

// Every slot holds its token's row, and every other slot still holds kUnwritten.
void check_cache(const PagedKvCache& cache, const Tensor& key, const Tensor& value,
                 const std::vector<std::int64_t>& slots) {
  const std::int64_t block_size = cache.block_size();
  const std::int64_t total_slots = cache.num_blocks() * block_size;
  std::vector<std::int64_t> token_of_slot(static_cast<std::size_t>(total_slots), -1);
  for (std::size_t t = 0; t < slots.size(); ++t)
    token_of_slot[static_cast<std::size_t>(slots[t])] = std::int64_t(t);
  for (std::int64_t slot = 0; slot < total_slots; ++slot) {
    const std::int64_t page = slot / block_size;
    const std::int64_t offset = slot % block_size;
    const std::int64_t token = token_of_slot[static_cast<std::size_t>(slot)];
    for (std::int64_t h = 0; h < key.extent(1); ++h) {
      for (std::int64_t d = 0; d < key.extent(2); ++d) {
        INFO("slot " << slot << " head " << h << " dim " << d);
        REQUIRE(cache.key(page, offset, h, d) == (token < 0 ? kUnwritten : key(token, h, d)));
      }
      for (std::int64_t d = 0; d < value.extent(2); ++d) {
        REQUIRE(cache.value(page, offset, h, d) == (token < 0 ? kUnwritten : value(token, h, d)));
      }
    }
  }
}

}  // namespace

TEST_CASE("block size 16: several sequences, prefixes, a chunk crossing a page", "[reference][kv_store]") {
  // s0: no prefix, 3 tokens at positions 0..2 -> page 5.
  // s1: 14 cached, 4 tokens at 14..17: 14, 15 in logical block 0 (page 2), 16, 17 in block 1 (page 7).
  // s2: 32 cached, 1 token at 32: logical block 2 -> page 3. Its prefix pages 0 and 1 are not written.
  // -1 entries are never reached, so they are not errors.
  Batch batch;
  batch.query_starts = {0, 3, 7, 8};
  batch.context_lens = {0, 14, 32};
  batch.max_blocks_per_seq = 3;
  batch.block_tables = {5, -1, -1,  //
                        2, 7,  -1,  //
                        0, 1,  3};
  const Tensor key = rows(8, 2, 4, 1.0);
  const Tensor value = rows(8, 2, 3, -1.0);  // value_head_dim differs from head_dim
  PagedKvCache cache = PagedKvCache::filled(8, 16, 2, 4, 3, kUnwritten);

  const std::vector<std::int64_t> slots = kv_store(key, value, batch, cache);
  CHECK(slots == std::vector<std::int64_t>{80, 81, 82, 46, 47, 112, 113, 48});
  check_cache(cache, key, value, slots);
}

TEST_CASE("block size 1: the slot is the page", "[reference][kv_store]") {
  // s0: 2 cached, positions 2, 3 -> pages table[2] = 4, table[3] = 0.
  // s1: no prefix, positions 0..2 -> pages 1, 6, 2 (its 4th entry, -7, is never used).
  Batch batch;
  batch.query_starts = {0, 2, 5};
  batch.context_lens = {2, 0};
  batch.max_blocks_per_seq = 4;
  batch.block_tables = {9, 8, 4, 0,  //
                        1, 6, 2, -7};
  const Tensor key = rows(5, 1, 2, 1.0);
  const Tensor value = rows(5, 1, 2, -1.0);
  PagedKvCache cache = PagedKvCache::filled(10, 1, 1, 2, 2, kUnwritten);

  const std::vector<std::int64_t> slots = kv_store(key, value, batch, cache);
  CHECK(slots == std::vector<std::int64_t>{4, 0, 1, 6, 2});
  check_cache(cache, key, value, slots);
}

TEST_CASE("sequences may share prefix pages and have empty chunks", "[reference][kv_store]") {
  // Prefix caching: both sequences' block 0 is page 4 (16 shared cached tokens); each writes its own
  // block 1. The middle sequence has no tokens in this chunk.
  Batch batch;
  batch.query_starts = {0, 2, 2, 3};
  batch.context_lens = {16, 5, 16};
  batch.max_blocks_per_seq = 2;
  batch.block_tables = {4, 0,   //
                        4, -1,  //
                        4, 2};
  const Tensor key = rows(3, 1, 2, 1.0);
  const Tensor value = rows(3, 1, 2, -1.0);
  PagedKvCache cache = PagedKvCache::filled(5, 16, 1, 2, 2, kUnwritten);

  const std::vector<std::int64_t> slots = kv_store(key, value, batch, cache);
  CHECK(slots == std::vector<std::int64_t>{0, 1, 32});
  check_cache(cache, key, value, slots);
}

TEST_CASE("an empty chunk writes nothing", "[reference][kv_store]") {
  Batch batch;
  batch.query_starts = {0};
  PagedKvCache cache = PagedKvCache::filled(2, 16, 1, 2, 2, kUnwritten);
  CHECK(kv_store(Tensor({0, 1, 2}), Tensor({0, 1, 2}), batch, cache).empty());
  check_cache(cache, Tensor({0, 1, 2}), Tensor({0, 1, 2}), {});
}

namespace {

// One valid two-sequence batch at block size 4; each error case breaks one thing in it.
struct Fixture {
  Batch batch;
  Tensor key = rows(4, 1, 2, 1.0);
  Tensor value = rows(4, 1, 2, -1.0);
  PagedKvCache cache = PagedKvCache::filled(4, 4, 1, 2, 2, kUnwritten);

  Fixture() {
    batch.query_starts = {0, 2, 4};
    batch.context_lens = {0, 3};  // s1 writes positions 3 (page 1) and 4 (page 2)
    batch.max_blocks_per_seq = 2;
    batch.block_tables = {0, -1,  //
                          1, 2};
  }

  // The error, after checking that nothing was written.
  attnplan::Error error() {
    const attnplan::Error error = expect_error([this] { kv_store(key, value, batch, cache); });
    CHECK(error.stage() == Stage::input);
    for (double element : cache.key.data) REQUIRE(element == kUnwritten);
    for (double element : cache.value.data) REQUIRE(element == kUnwritten);
    return error;
  }
};

}  // namespace

TEST_CASE("the error fixture is valid as given", "[reference][kv_store]") {
  Fixture fixture;
  CHECK(kv_store(fixture.key, fixture.value, fixture.batch, fixture.cache) ==
        std::vector<std::int64_t>{0, 1, 7, 8});
}

TEST_CASE("invalid query_starts", "[reference][kv_store][errors]") {
  SECTION("not starting at 0") {
    Fixture fixture;
    fixture.batch.query_starts = {1, 2, 4};
    CHECK(contains(fixture.error().message(), "query_starts[0] is 1"));
  }
  SECTION("decreasing") {
    Fixture fixture;
    fixture.batch.query_starts = {0, 3, 2};
    fixture.batch.context_lens = {0, 3};
    CHECK(contains(fixture.error().message(), "non-decreasing"));
  }
  SECTION("not ending at the token count") {
    Fixture fixture;
    fixture.batch.query_starts = {0, 2, 3};
    CHECK(contains(fixture.error().message(), "the chunk has 4 tokens"));
  }
  SECTION("one entry too few") {
    Fixture fixture;
    fixture.batch.query_starts = {0, 4};
    CHECK(contains(fixture.error().message(), "query_starts has 2 entries"));
  }
}

TEST_CASE("invalid context_lens and block table sizes", "[reference][kv_store][errors]") {
  SECTION("negative context_len") {
    Fixture fixture;
    fixture.batch.context_lens = {0, -1};
    CHECK(contains(fixture.error().message(), "context_lens[1] is -1"));
  }
  SECTION("block_tables of the wrong size") {
    Fixture fixture;
    fixture.batch.block_tables = {0, -1, 1};
    CHECK(contains(fixture.error().message(), "block_tables has 3 entries"));
  }
}

TEST_CASE("a position beyond max_blocks_per_seq * block_size", "[reference][kv_store][errors]") {
  Fixture fixture;
  fixture.batch.context_lens = {
      0, 7};  // s1 writes positions 7 (block 1) and 8 (block 2 >= max_blocks_per_seq 2)
  const attnplan::Error error = fixture.error();
  CHECK(contains(error.message(), "sequence 1: position 8"));
  CHECK(contains(error.message(), "beyond max_blocks_per_seq = 2"));
}

TEST_CASE("a block table entry outside the cache", "[reference][kv_store][errors]") {
  SECTION("negative") {
    Fixture fixture;
    fixture.batch.block_tables = {-1, -1, 1, 2};
    CHECK(contains(fixture.error().message(), "block_tables[0][0] is -1"));
  }
  SECTION("num_blocks itself") {
    Fixture fixture;
    fixture.batch.block_tables = {0, -1, 1, 4};
    CHECK(contains(fixture.error().message(), "block_tables[1][1] is 4, outside the cache's pages [0, 4)"));
  }
}

TEST_CASE("two tokens mapping to one slot", "[reference][kv_store][errors]") {
  SECTION("across sequences") {
    // s0's positions 0, 1 are on page 1 at offsets 0, 1; s1's position 4 is page 1 offset 0 too.
    Fixture fixture;
    fixture.batch.block_tables = {1, -1, 3, 1};
    const attnplan::Error error = fixture.error();
    CHECK(contains(error.message(), "token rows 0 (sequence 0, position 0) and 3 (sequence 1, position 4)"));
    CHECK(contains(error.message(), "cache slot 4"));
  }
  SECTION("within a sequence") {
    // Block size 1: s1's positions 3 and 4 use its entries 3 and 4, both page 2, so both land in slot 2.
    Fixture fixture;
    fixture.cache = PagedKvCache::filled(4, 1, 1, 2, 2, kUnwritten);
    fixture.batch.max_blocks_per_seq = 5;
    fixture.batch.block_tables = {0, 1, 2, 3, 3,  //
                                  0, 0, 0, 2, 2};
    CHECK(contains(fixture.error().message(), "both map to cache slot 2"));
  }
}

TEST_CASE("shapes that disagree", "[reference][kv_store][errors]") {
  SECTION("kv_heads differ from the cache") {
    Fixture fixture;
    fixture.key = rows(4, 2, 2, 1.0);
    fixture.value = rows(4, 2, 2, -1.0);
    CHECK(contains(fixture.error().message(), "do not match the cache"));
  }
  SECTION("value_head_dim differs from the cache") {
    Fixture fixture;
    fixture.value = rows(4, 1, 3, -1.0);
    CHECK(contains(fixture.error().message(), "value rows [1, 3]"));
  }
  SECTION("key and value token counts differ") {
    Fixture fixture;
    fixture.value = rows(3, 1, 2, -1.0);
    CHECK(contains(fixture.error().message(), "disagree on tokens"));
  }
  SECTION("key of the wrong rank") {
    Fixture fixture;
    fixture.key = Tensor({4, 2});
    CHECK(contains(fixture.error().message(), "key must be [tokens, kv_heads, head_dim]"));
  }
}
