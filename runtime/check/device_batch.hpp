// A reference batch (and its spans) copied to the device as PrefillPlan::execute reads it: the device arrays
// and the BatchDescription over them and over the host copies. For `attnplan verify`, `attnplan bench` and
// the tests; an engine builds its BatchDescription from its own arrays.
#pragma once

#include <vector>

#include "driver/memory.hpp"
#include "plan/batch.hpp"
#include "reference/batch.hpp"
#include "reference/layer.hpp"

namespace attnplan::check {

struct DeviceBatch {
  driver::DeviceBuffer query_starts, context_lens, block_tables, span_offsets, span_bounds;
  std::vector<int> host_span_bounds;  // 2 ints per span, what description.host_span_bounds views
  // Views `batch`'s and `spans`' host vectors: they must outlive it.
  plan::BatchDescription description;
};

// Needs a current context. Spans with empty offsets: none. With offsets but no span, span_bounds still gets
// room for one (a plan built for spans reads the pointer).
DeviceBatch upload_batch(const reference::Batch& batch, const reference::Spans& spans, int max_query_len);

}  // namespace attnplan::check
