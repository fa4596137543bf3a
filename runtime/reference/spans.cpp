// Spec sections 6 and 8: the bidirectional spans' CSR and the rules a span must keep.
#include <fmt/format.h>

#include "core/error.hpp"
#include "reference/layer.hpp"

namespace attnplan::reference {
namespace {

[[noreturn]] void fail(std::string message) {
  throw Error(Stage::input, "spans: " + std::move(message));
}

}  // namespace

void validate_spans(const Spans& spans, const Batch& batch) {
  // The span rules are relative to each sequence's chunk, so the batch itself must hold together first.
  validate_batch(batch, batch.query_starts.empty() ? 0 : batch.query_starts.back());

  if (spans.offsets.empty()) {
    if (!spans.bounds.empty()) {
      fail(fmt::format("span_bounds has {} spans but span_offsets is empty (empty offsets mean no spans)",
                       spans.bounds.size()));
    }
    return;
  }
  const int num_seqs = batch.num_seqs();
  if (spans.offsets.size() != static_cast<std::size_t>(num_seqs) + 1) {
    fail(fmt::format("span_offsets has {} entries; {} sequences need {}", spans.offsets.size(), num_seqs,
                     num_seqs + 1));
  }
  if (spans.offsets.front() != 0) {
    fail(fmt::format("span_offsets[0] is {}; it must be 0", spans.offsets.front()));
  }
  for (int s = 0; s < num_seqs; ++s) {
    if (spans.offsets[s + 1] < spans.offsets[s]) {
      fail(fmt::format("span_offsets must be non-decreasing: span_offsets[{}] = {} < span_offsets[{}] = {}",
                       s + 1, spans.offsets[s + 1], s, spans.offsets[s]));
    }
  }
  if (spans.offsets.back() < 0 || static_cast<std::size_t>(spans.offsets.back()) != spans.bounds.size()) {
    fail(fmt::format("span_offsets[{}] is {} but span_bounds has {} spans", num_seqs, spans.offsets.back(),
                     spans.bounds.size()));
  }

  for (int s = 0; s < num_seqs; ++s) {
    const std::int64_t context_len = batch.context_lens[s];
    // Positions 0 .. context_len + chunk length - 1 exist for this execute; a span past them names tokens
    // that are neither cached nor in the chunk.
    const std::int64_t total_len = context_len + (batch.query_starts[s + 1] - batch.query_starts[s]);
    std::int64_t previous_end = 0;
    for (int j = spans.offsets[s]; j < spans.offsets[s + 1]; ++j) {
      // Named variables, not a structured binding: fail_span captures them, which clang before 16 refuses.
      const int start = spans.bounds[static_cast<std::size_t>(j)][0];
      const int end = spans.bounds[static_cast<std::size_t>(j)][1];
      const int index = j - spans.offsets[s];
      // "span 2 of sequence 1 [10, 20) straddles ... (span_bounds[5])": the per-sequence name reads
      // naturally, the flat index finds the entry in the array.
      const auto fail_span = [&](const std::string& problem) {
        fail(fmt::format("span {} of sequence {} [{}, {}) {} (span_bounds[{}])", index, s, start, end,
                         problem, j));
      };
      if (start < 0) fail_span("starts before position 0");
      if (end <= start) fail_span("is empty");
      if (end > total_len) {
        fail_span(fmt::format("ends past the sequence's {} positions (context_len {} + chunk {})", total_len,
                              context_len, total_len - context_len));
      }
      if (index > 0 && start < previous_end) {
        fail_span(fmt::format("is unsorted or overlaps the span before it, which ends at {}", previous_end));
      }
      // A straddling span would need the cached prefix's k/v recomputed with bidirectional attention.
      if (start < context_len && context_len < end) {
        fail_span(
            fmt::format("straddles context_len {}; the cached prefix cannot be recomputed", context_len));
      }
      previous_end = end;
    }
  }
}

}  // namespace attnplan::reference
