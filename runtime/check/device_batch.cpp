#include "check/device_batch.hpp"

namespace attnplan::check {

DeviceBatch upload_batch(const reference::Batch& batch, const reference::Spans& spans, int max_query_len) {
  DeviceBatch device;
  device.query_starts = driver::DeviceBuffer::from_host(batch.query_starts);
  device.context_lens = driver::DeviceBuffer::from_host(batch.context_lens);
  device.block_tables = driver::DeviceBuffer::from_host(batch.block_tables);
  plan::BatchDescription& description = device.description;
  description.num_seqs = batch.num_seqs();
  description.num_tokens = batch.query_starts.back();
  description.max_query_len = max_query_len;
  description.max_blocks_per_seq = batch.max_blocks_per_seq;
  description.query_starts = device.query_starts.data<const int>();
  description.context_lens = device.context_lens.data<const int>();
  description.block_tables = device.block_tables.data<const int>();
  description.host_query_starts = batch.query_starts;
  description.host_context_lens = batch.context_lens;
  description.host_block_tables = batch.block_tables;
  if (!spans.offsets.empty()) {
    for (const auto& span : spans.bounds)
      device.host_span_bounds.insert(device.host_span_bounds.end(), {span[0], span[1]});
    const std::vector<int> padded =
        device.host_span_bounds.empty() ? std::vector<int>{0, 0} : device.host_span_bounds;
    device.span_offsets = driver::DeviceBuffer::from_host(spans.offsets);
    device.span_bounds = driver::DeviceBuffer::from_host(padded);
    description.span_offsets = device.span_offsets.data<const int>();
    description.span_bounds = device.span_bounds.data<const int>();
    description.host_span_offsets = spans.offsets;
    description.host_span_bounds = device.host_span_bounds;
  }
  return device;
}

}  // namespace attnplan::check
