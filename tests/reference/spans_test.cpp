// validate_spans(): the CSR and the per-span rules of spec sections 6 and 8, each broken once.
#include <string>
#include <vector>

#include "reference/layer.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using attnplan::Stage;
using attnplan::reference::Batch;
using attnplan::reference::Spans;
using attnplan::reference::validate_spans;

namespace {

// Two sequences: s0 has 10 cached positions and a chunk of 4 (positions 0..13); s1 has 15 cached and a
// chunk of 10 (positions 0..24). Block tables are not read by the span rules.
Batch two_sequences() {
  Batch batch;
  batch.query_starts = {0, 4, 14};
  batch.context_lens = {10, 15};
  return batch;
}

std::string error_of(const Spans& spans) {
  const attnplan::Error error = expect_error([&] { validate_spans(spans, two_sequences()); });
  CHECK(error.stage() == Stage::input);
  return error.message();
}

}  // namespace

TEST_CASE("validate_spans accepts sorted, disjoint spans that do not straddle context_len",
          "[reference][spans]") {
  validate_spans({}, two_sequences());  // no spans at all
  // s0: a span wholly in the cached prefix, one ending exactly at context_len... s1: one starting there,
  // back to back with the next, and one ending at the sequence's last position.
  const Spans spans{{0, 2, 5}, {{0, 3}, {4, 10}, {15, 18}, {18, 20}, {22, 25}}};
  validate_spans(spans, two_sequences());
  // A sequence without spans.
  validate_spans(Spans{{0, 0, 1}, {{16, 17}}}, two_sequences());
}

TEST_CASE("validate_spans: a span straddling context_len is an input error", "[reference][spans]") {
  // s1's third span [10, 20) crosses its context_len 15: the cached 10..14 cannot see 15..19.
  const Spans spans{{0, 0, 3}, {{0, 2}, {4, 6}, {10, 20}}};
  CHECK(error_of(spans) ==
        "spans: span 2 of sequence 1 [10, 20) straddles context_len 15; the cached prefix "
        "cannot be recomputed (span_bounds[2])");
}

TEST_CASE("validate_spans: each broken span rule is named", "[reference][spans]") {
  CHECK(contains(error_of({{0, 1, 1}, {{-1, 2}}}), "span 0 of sequence 0 [-1, 2) starts before position 0"));
  CHECK(contains(error_of({{0, 1, 1}, {{3, 3}}}), "span 0 of sequence 0 [3, 3) is empty"));
  CHECK(contains(error_of({{0, 1, 1}, {{5, 4}}}), "is empty"));
  CHECK(contains(error_of({{0, 0, 1}, {{20, 26}}}),
                 "span 0 of sequence 1 [20, 26) ends past the sequence's 25"));
  CHECK(contains(error_of({{0, 2, 2}, {{0, 4}, {3, 6}}}),
                 "span 1 of sequence 0 [3, 6) is unsorted or overlaps"));
  CHECK(contains(error_of({{0, 2, 2}, {{4, 6}, {0, 2}}}), "is unsorted or overlaps"));
}

TEST_CASE("validate_spans: the CSR offsets must describe the bounds", "[reference][spans]") {
  CHECK(contains(error_of({{0, 1}, {{0, 1}}}), "span_offsets has 2 entries; 2 sequences need 3"));
  CHECK(contains(error_of({{1, 1, 1}, {{0, 1}}}), "span_offsets[0] is 1"));
  CHECK(contains(error_of({{0, 1, 0}, {{0, 1}}}), "non-decreasing"));
  CHECK(
      contains(error_of({{0, 1, 1}, {{0, 1}, {2, 3}}}), "span_offsets[2] is 1 but span_bounds has 2 spans"));
  CHECK(contains(error_of({{}, {{0, 1}}}), "span_offsets is empty"));
}

TEST_CASE("validate_spans checks the batch it is measured against", "[reference][spans]") {
  Batch batch = two_sequences();
  batch.query_starts = {0, 4};  // one entry short
  CHECK(expect_error([&] { validate_spans({}, batch); }).stage() == Stage::input);
}
