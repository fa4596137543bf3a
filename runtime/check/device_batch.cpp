#include "check/device_batch.hpp"

#include <algorithm>
#include <utility>

namespace attnplan::check {

DeviceBatch::DeviceBatch(reference::Batch batch, const reference::Spans& spans, bool plan_has_spans)
    : host_(std::move(batch)), span_offsets_(spans.offsets) {
  for (const auto& span : spans.bounds) span_bounds_.insert(span_bounds_.end(), {span[0], span[1]});
  if (plan_has_spans && span_offsets_.empty()) span_offsets_.assign(host_.query_starts.size(), 0);

  query_starts_ = driver::DeviceBuffer::from_host(host_.query_starts);
  context_lens_ = driver::DeviceBuffer::from_host(host_.context_lens);
  block_tables_ = driver::DeviceBuffer::from_host(host_.block_tables);
  plan::BatchDescription& d = description_;
  d.num_seqs = host_.num_seqs();
  d.num_tokens = host_.query_starts.empty() ? 0 : host_.query_starts.back();
  for (std::size_t s = 0; s + 1 < host_.query_starts.size(); ++s)
    d.max_query_len = std::max(d.max_query_len, host_.query_starts[s + 1] - host_.query_starts[s]);
  d.max_blocks_per_seq = host_.max_blocks_per_seq;
  d.query_starts = query_starts_.data<const int>();
  d.context_lens = context_lens_.data<const int>();
  d.block_tables = block_tables_.data<const int>();
  d.host_query_starts = host_.query_starts;
  d.host_context_lens = host_.context_lens;
  d.host_block_tables = host_.block_tables;
  if (!span_offsets_.empty()) {
    span_offsets_device_ = driver::DeviceBuffer::from_host(span_offsets_);
    span_bounds_device_ =
        driver::DeviceBuffer::from_host(span_bounds_.empty() ? std::vector<int>{0, 0} : span_bounds_);
    d.span_offsets = span_offsets_device_.data<const int>();
    d.span_bounds = span_bounds_device_.data<const int>();
    d.host_span_offsets = span_offsets_;
    d.host_span_bounds = span_bounds_;
  }
}

}  // namespace attnplan::check
