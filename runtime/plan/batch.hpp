// The batch description of one execute() (spec section 8): device pointers for the kernels and the same
// arrays on the host, so that every input that contradicts the plan or itself is found before any launch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace attnplan::plan {

struct BatchDescription {
  int num_seqs = 0;
  int num_tokens = 0;          // rows of the chunk: query_starts[num_seqs]
  int max_query_len = 0;       // longest chunk of one sequence (launch shapes)
  int max_blocks_per_seq = 0;  // columns of block_tables

  // Device arrays, read by the kernels.
  const int* query_starts = nullptr;  // [num_seqs + 1], cu_seqlens_q
  const int* context_lens = nullptr;  // [num_seqs]: tokens of each sequence already in the cache
  const int* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]: page of each logical block
  const int* span_offsets = nullptr;  // [num_seqs + 1] or null: CSR over span_bounds
  const int* span_bounds = nullptr;   // [num_spans, 2]: [start, end) absolute positions

  // The same arrays on the host, checked before any launch. Engines keep these anyway (they built them).
  std::span<const int> host_query_starts;
  std::span<const int> host_context_lens;
  std::span<const int> host_block_tables;
  std::span<const int> host_span_offsets;  // empty: no spans
  std::span<const int> host_span_bounds;   // 2 ints per span
};

// Everything that must hold for a launch to be safe and meaningful; throws Error(input) naming the field
// and the rule (e.g. "block_tables[1][3]: page 900 is outside the pool of 512 pages"). Pure, host-only.
struct BatchLimits {
  int max_tokens = 0;  // the plan's max_tokens
  int block_size = 0;  // tokens per page
  int num_blocks = 0;  // pages in the caller's pool
  bool spans_allowed = false;
};
void validate_batch(const BatchDescription& batch, const BatchLimits& limits);

}  // namespace attnplan::plan
