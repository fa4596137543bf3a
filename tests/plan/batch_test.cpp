#include "plan/batch.hpp"

#include <cstdint>
#include <vector>

#include "support/catch.hpp"
#include "support/expect_error.hpp"

using attnplan::plan::BatchDescription;
using attnplan::plan::BatchLimits;
using attnplan::plan::validate_batch;

namespace {

// Two sequences: 5 tokens after a 14-token prefix and 3 new tokens, pages of 8 tokens.
struct Fixture {
  std::vector<int> starts{0, 5, 8};
  std::vector<int> context{14, 0};
  std::vector<int> tables{0, 1, 2, 3, 4, 5};  // 3 pages per sequence
  std::vector<int> span_offsets;
  std::vector<int> span_bounds;
  int dummy = 0;
  BatchLimits limits{64, 8, 6, true};

  BatchDescription describe() const {
    BatchDescription batch;
    batch.num_seqs = 2;
    batch.num_tokens = starts.back();
    batch.max_query_len = 5;
    batch.max_blocks_per_seq = 3;
    batch.query_starts = batch.context_lens = batch.block_tables = &dummy;
    batch.host_query_starts = starts;
    batch.host_context_lens = context;
    batch.host_block_tables = tables;
    if (!span_offsets.empty()) {
      batch.span_offsets = batch.span_bounds = &dummy;
      batch.host_span_offsets = span_offsets;
      batch.host_span_bounds = span_bounds;
    }
    return batch;
  }
};

void rejected(const Fixture& fixture, const std::string& needle) {
  const attnplan::Error error = expect_error([&] { validate_batch(fixture.describe(), fixture.limits); });
  INFO(error.what());
  CHECK(error.stage() == attnplan::Stage::input);
  CHECK(contains(error.message(), needle));
}

}  // namespace

TEST_CASE("a consistent batch passes", "[plan][batch]") {
  Fixture fixture;
  CHECK_NOTHROW(validate_batch(fixture.describe(), fixture.limits));
  fixture.span_offsets = {0, 0, 1};
  fixture.span_bounds = {1, 3};  // sequence 1: no prefix, span inside the chunk
  CHECK_NOTHROW(validate_batch(fixture.describe(), fixture.limits));
}

TEST_CASE("every contradiction is named before any launch", "[plan][batch]") {
  {
    Fixture f;
    f.starts = {0, 6, 5};
    rejected(f, "query_starts[2]");
  }
  {
    Fixture f;
    f.starts = {1, 5, 8};
    rejected(f, "query_starts[0]");
  }
  {
    Fixture f;
    f.limits.max_tokens = 4;
    rejected(f, "num_tokens: 8 is outside [0, max_tokens = 4]");
  }
  {
    Fixture f;
    f.tables[2] = 6;  // sequence 0 needs its third page (positions 16..18)
    rejected(f, "block_tables[0][2]: page 6 is outside the pool of 6 pages");
  }
  {
    Fixture f;
    f.tables[3] = 2;  // sequence 1 writes into sequence 0's written page
    rejected(f, "page 2 receives this chunk's tokens");
  }
  {
    Fixture f;
    f.context = {30, 0};  // needs 5 pages
    rejected(f, "context_lens[0]");
  }
  {
    Fixture f;
    f.context = {-1, 0};
    rejected(f, "context_lens[0]: -1");
  }
  {
    Fixture f;
    f.span_offsets = {0, 1, 1};
    f.span_bounds = {10, 16};  // straddles context_len 14 of sequence 0
    rejected(f, "straddles context_len 14");
  }
  {
    Fixture f;
    f.span_offsets = {0, 0, 2};
    f.span_bounds = {0, 2, 1, 3};
    rejected(f, "overlaps");
  }
  {
    Fixture f;
    f.span_offsets = {0, 0, 1};
    f.span_bounds = {2, 9};  // sequence 1 has 3 tokens
    rejected(f, "ends past");
  }
  {
    Fixture f;
    f.span_offsets = {0, 0, 1};
    f.span_bounds = {0, 2};
    f.limits.spans_allowed = false;
    rejected(f, "bidirectional_spans false");
  }
}

TEST_CASE("device arrays must be present and int-aligned; max_query_len within max_tokens",
          "[plan][batch][reliability]") {
  const Fixture f;
  auto rejected_batch = [&](const std::string& needle, auto mutate) {
    BatchDescription batch = f.describe();
    mutate(batch);
    const attnplan::Error error = expect_error([&] { validate_batch(batch, f.limits); });
    INFO(error.what());
    CHECK(error.stage() == attnplan::Stage::input);
    CHECK(contains(error.message(), needle));
  };
  // A pointer one byte past an int: never dereferenced here, only its address is checked.
  const int* misaligned = reinterpret_cast<const int*>(reinterpret_cast<std::uintptr_t>(&f.dummy) + 1);
  rejected_batch("query_starts: null device pointer", [](BatchDescription& b) { b.query_starts = nullptr; });
  rejected_batch("context_lens: null device pointer", [](BatchDescription& b) { b.context_lens = nullptr; });
  rejected_batch("block_tables: null device pointer", [](BatchDescription& b) { b.block_tables = nullptr; });
  rejected_batch("query_starts: device pointer", [&](BatchDescription& b) { b.query_starts = misaligned; });
  rejected_batch("not aligned to 4 bytes", [&](BatchDescription& b) { b.block_tables = misaligned; });
  rejected_batch("max_query_len: 65 is outside [0, max_tokens = 64]",
                 [](BatchDescription& b) { b.max_query_len = 65; });
  rejected_batch("max_query_len: 4 is less than the longest chunk, 5 tokens",
                 [](BatchDescription& b) { b.max_query_len = 4; });
  const std::vector<int> offsets{0, 0, 1}, bounds{1, 3};
  rejected_batch("span_bounds: null device pointer", [&](BatchDescription& b) {
    b.host_span_offsets = offsets;
    b.host_span_bounds = bounds;
    b.span_offsets = &f.dummy;
  });
  rejected_batch("span_offsets: device pointer", [&](BatchDescription& b) {
    b.host_span_offsets = offsets;
    b.host_span_bounds = bounds;
    b.span_offsets = misaligned;
    b.span_bounds = &f.dummy;
  });
  // A padded max_query_len (one captured graph for many batches) is fine.
  BatchDescription padded = f.describe();
  padded.max_query_len = f.limits.max_tokens;
  CHECK_NOTHROW(validate_batch(padded, f.limits));
}

TEST_CASE("prefix pages may be shared, unused table entries are ignored", "[plan][batch]") {
  Fixture f;
  f.context = {8, 8};
  f.starts = {0, 1, 2};
  f.tables = {0, 1, -1, 0, 2, -1};  // both sequences read page 0 (a shared prefix), write their own page
  CHECK_NOTHROW(validate_batch(f.describe(), f.limits));
}
