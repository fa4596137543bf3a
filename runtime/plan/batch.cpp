#include "plan/batch.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <unordered_map>

#include "core/error.hpp"

namespace attnplan::plan {

namespace {

void require(bool condition, std::string message) {
  if (!condition) throw Error(Stage::input, std::move(message));
}

// The kernels load these arrays as int32: a misaligned one is a device fault, so it is refused here.
void require_int_array(const int* pointer, const char* field) {
  require(pointer != nullptr, fmt::format("{}: null device pointer", field));
  require(reinterpret_cast<std::uintptr_t>(pointer) % alignof(int) == 0,
          fmt::format("{}: device pointer {} is not aligned to {} bytes", field,
                      static_cast<const void*>(pointer), alignof(int)));
}

}  // namespace

void validate_batch(const BatchDescription& batch, const BatchLimits& limits) {
  const int seqs = batch.num_seqs;
  require(seqs >= 1, fmt::format("num_seqs: {} must be at least 1", seqs));
  require(batch.num_tokens >= 0 && batch.num_tokens <= limits.max_tokens,
          fmt::format("num_tokens: {} is outside [0, max_tokens = {}]", batch.num_tokens, limits.max_tokens));
  require(batch.max_blocks_per_seq >= 1,
          fmt::format("max_blocks_per_seq: {} must be at least 1", batch.max_blocks_per_seq));
  // Launch shapes are sized by max_query_len; an engine may pad it (one graph for many batches), but
  // never past what the plan was compiled for.
  require(batch.max_query_len >= 0 && batch.max_query_len <= limits.max_tokens,
          fmt::format("max_query_len: {} is outside [0, max_tokens = {}]", batch.max_query_len,
                      limits.max_tokens));
  require_int_array(batch.query_starts, "query_starts");
  require_int_array(batch.context_lens, "context_lens");
  require_int_array(batch.block_tables, "block_tables");
  require(batch.host_query_starts.size() == std::size_t(seqs) + 1,
          fmt::format("host_query_starts: {} entries, expected num_seqs + 1 = {}",
                      batch.host_query_starts.size(), seqs + 1));
  require(batch.host_context_lens.size() == std::size_t(seqs),
          fmt::format("host_context_lens: {} entries, expected num_seqs = {}", batch.host_context_lens.size(),
                      seqs));
  require(batch.host_block_tables.size() == std::size_t(seqs) * std::size_t(batch.max_blocks_per_seq),
          fmt::format("host_block_tables: {} entries, expected num_seqs * max_blocks_per_seq = {}",
                      batch.host_block_tables.size(), std::size_t(seqs) * batch.max_blocks_per_seq));

  const auto& starts = batch.host_query_starts;
  require(starts[0] == 0, fmt::format("query_starts[0]: {} must be 0", starts[0]));
  require(starts[seqs] == batch.num_tokens,
          fmt::format("query_starts[{}]: {} must equal num_tokens {}", seqs, starts[seqs], batch.num_tokens));
  int longest = 0;
  for (int s = 0; s < seqs; ++s) {
    require(starts[s + 1] >= starts[s],
            fmt::format("query_starts[{}]: {} is less than query_starts[{}] = {} (must "
                        "be non-decreasing)",
                        s + 1, starts[s + 1], s, starts[s]));
    longest = std::max(longest, starts[s + 1] - starts[s]);
  }
  require(batch.max_query_len >= longest,
          fmt::format("max_query_len: {} is less than the longest chunk, {} tokens", batch.max_query_len,
                      longest));

  // Every page a sequence reads must exist; every slot the chunk writes must belong to that sequence alone.
  std::unordered_map<long long, int> written_page_owner;
  for (int s = 0; s < seqs; ++s) {
    const long long context = batch.host_context_lens[s];
    require(context >= 0, fmt::format("context_lens[{}]: {} must be non-negative", s, context));
    const long long total = context + (starts[s + 1] - starts[s]);
    const long long blocks_needed = (total + limits.block_size - 1) / limits.block_size;
    require(blocks_needed <= batch.max_blocks_per_seq,
            fmt::format(
                "context_lens[{}]: sequence {} reaches position {}, which needs {} pages of {} tokens but "
                "block_tables has {} per sequence",
                s, s, total - 1, blocks_needed, limits.block_size, batch.max_blocks_per_seq));
    for (long long b = 0; b < blocks_needed; ++b) {
      const int page = batch.host_block_tables[std::size_t(s) * batch.max_blocks_per_seq + b];
      require(page >= 0 && page < limits.num_blocks,
              fmt::format("block_tables[{}][{}]: page {} is outside the pool of {} pages", s, b, page,
                          limits.num_blocks));
      const bool written = (b + 1) * limits.block_size > context && starts[s + 1] > starts[s];
      if (!written) continue;  // prefix pages may be shared between sequences (prefix caching)
      auto [it, inserted] = written_page_owner.emplace(page, s);
      require(inserted,
              fmt::format("block_tables[{}][{}]: page {} receives this chunk's tokens of sequence {} "
                          "and of sequence {}",
                          s, b, page, s, it->second));
    }
  }

  if (batch.host_span_offsets.empty()) {
    require(batch.host_span_bounds.empty(), "span_bounds: given without span_offsets");
    return;
  }
  require(limits.spans_allowed, "span_offsets: this plan's config has bidirectional_spans false");
  require_int_array(batch.span_offsets, "span_offsets");
  require_int_array(batch.span_bounds, "span_bounds");
  const auto& offsets = batch.host_span_offsets;
  const auto& bounds = batch.host_span_bounds;
  require(offsets.size() == std::size_t(seqs) + 1,
          fmt::format("span_offsets: {} entries, expected num_seqs + 1 = {}", offsets.size(), seqs + 1));
  require(bounds.size() % 2 == 0, "span_bounds: must hold [start, end) pairs");
  require(offsets[0] == 0 && std::size_t(offsets[seqs]) * 2 == bounds.size(),
          fmt::format("span_offsets: must start at 0 and end at the number of spans, {}", bounds.size() / 2));
  for (int s = 0; s < seqs; ++s) {
    require(offsets[s + 1] >= offsets[s], fmt::format("span_offsets[{}]: must be non-decreasing", s + 1));
    const int context = batch.host_context_lens[s];
    const int total = context + starts[s + 1] - starts[s];
    int previous_end = 0;
    for (int i = offsets[s]; i < offsets[s + 1]; ++i) {
      const int start = bounds[2 * i], end = bounds[2 * i + 1];
      const std::string where = fmt::format("span_bounds[{}] (sequence {}) [{}, {})", i, s, start, end);
      require(start >= 0 && start < end, where + ": must be non-empty with 0 <= start < end");
      require(end <= total, fmt::format("{}: ends past the sequence's {} tokens", where, total));
      require(start >= previous_end, where +
                                         ": overlaps or precedes the previous span (spans must be sorted and "
                                         "disjoint)");
      require(!(start < context && context < end),
              fmt::format("{}: straddles context_len {} (the cached prefix cannot be recomputed)", where,
                          context));
      previous_end = end;
    }
  }
}

}  // namespace attnplan::plan
