// check::spot_rows, the rows `attnplan bench`'s spot check compares (the check itself runs on the device:
// tests/gpu/spot_check_gpu_test.cpp).
#include "check/spot_check.hpp"

#include <cstdint>
#include <vector>

#include "core/error.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

namespace {

using attnplan::reference::Batch;
using Rows = std::vector<std::int64_t>;

Batch batch_of(std::vector<int> query_starts) {
  Batch batch;
  batch.context_lens.assign(query_starts.size() - 1, 0);
  batch.query_starts = std::move(query_starts);
  return batch;
}

}  // namespace

TEST_CASE("spot_rows: each sequence's first and last row, then rows spread over the chunk", "[check][spot]") {
  // Three sequences of 50, 100 and 150 rows; 16 rows: the six ends, then the middles of 16 shares of 300
  // (9, 28, 46, 65, ...) until 16 distinct rows.
  const Rows rows = attnplan::check::spot_rows(batch_of({0, 50, 150, 300}), 16);
  CHECK(rows == Rows{0, 9, 28, 46, 49, 50, 65, 84, 103, 121, 140, 149, 150, 159, 178, 299});

  // Fewer rows than ends: sequence by sequence, first then last.
  CHECK(attnplan::check::spot_rows(batch_of({0, 50, 150, 300}), 3) == Rows{0, 49, 50});
  // An empty sequence has no rows; one row sequences count once.
  CHECK(attnplan::check::spot_rows(batch_of({0, 0, 1, 4}), 8) == Rows{0, 1, 2, 3});
  // More rows asked than the chunk has: every row, once.
  CHECK(attnplan::check::spot_rows(batch_of({0, 5}), 16) == Rows{0, 1, 2, 3, 4});
}

TEST_CASE("spot_rows rejects max_rows below 1", "[check][spot]") {
  CHECK(expect_error([] {
          attnplan::check::spot_rows(batch_of({0, 5}), 0);
        }).stage() == attnplan::Stage::input);
}
