// A plan::BatchDescription built from host vectors: the host arrays (owned here, so that the
// description's host spans stay valid) and their device copies. For the CLI and the tests; an engine
// keeps its own arrays and fills BatchDescription itself.
#pragma once

#include <vector>

#include "driver/memory.hpp"
#include "plan/batch.hpp"
#include "reference/batch.hpp"
#include "reference/layer.hpp"

namespace attnplan::check {

class DeviceBatch {
 public:
  // Uploads `batch` and `spans` (needs a current context). num_tokens is query_starts.back() and
  // max_query_len the longest chunk. `plan_has_spans`: a plan compiled with bidirectional_spans reads
  // span_offsets in every launch, so a batch without spans then gets all-zero offsets (no span in any
  // sequence) instead of a null pointer. An empty span_bounds is uploaded as one dummy pair, because a
  // 0-byte buffer has no address.
  DeviceBatch(reference::Batch batch, const reference::Spans& spans, bool plan_has_spans);
  DeviceBatch(DeviceBatch&&) noexcept = default;  // vectors and buffers keep their storage when moved
  DeviceBatch& operator=(DeviceBatch&&) noexcept = default;
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  const plan::BatchDescription& description() const { return description_; }
  const reference::Batch& host() const { return host_; }

 private:
  reference::Batch host_;
  std::vector<int> span_offsets_;  // [num_seqs + 1] or empty
  std::vector<int> span_bounds_;   // [num_spans, 2], flattened
  driver::DeviceBuffer query_starts_, context_lens_, block_tables_, span_offsets_device_, span_bounds_device_;
  plan::BatchDescription description_;
};

}  // namespace attnplan::check
