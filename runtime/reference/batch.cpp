#include "reference/batch.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace attnplan::reference {

void validate_batch(const Batch& batch, std::int64_t num_tokens) {
  auto fail = [](std::string message) { throw Error(Stage::input, std::move(message)); };
  const int num_seqs = batch.num_seqs();
  if (batch.query_starts.size() != static_cast<std::size_t>(num_seqs) + 1) {
    fail(fmt::format("query_starts has {} entries; {} sequences (context_lens) need {}",
                     batch.query_starts.size(), num_seqs, num_seqs + 1));
  }
  if (batch.query_starts.front() != 0) {
    fail(fmt::format("query_starts[0] is {}; it must be 0", batch.query_starts.front()));
  }
  for (int s = 0; s < num_seqs; ++s) {
    if (batch.query_starts[s + 1] < batch.query_starts[s]) {
      fail(fmt::format("query_starts must be non-decreasing: query_starts[{}] = {} < query_starts[{}] = {}",
                       s + 1, batch.query_starts[s + 1], s, batch.query_starts[s]));
    }
    if (batch.context_lens[s] < 0) {
      fail(fmt::format("context_lens[{}] is {}; it must be >= 0", s, batch.context_lens[s]));
    }
  }
  if (batch.query_starts.back() != num_tokens) {
    fail(fmt::format("query_starts[{}] is {} but the chunk has {} tokens", num_seqs,
                     batch.query_starts.back(), num_tokens));
  }
  if (batch.max_blocks_per_seq < 0) {
    fail(fmt::format("max_blocks_per_seq is {}; it must be >= 0", batch.max_blocks_per_seq));
  }
  const std::size_t table_entries =
      static_cast<std::size_t>(num_seqs) * static_cast<std::size_t>(batch.max_blocks_per_seq);
  if (batch.block_tables.size() != table_entries) {
    fail(fmt::format("block_tables has {} entries; [num_seqs = {}, max_blocks_per_seq = {}] needs {}",
                     batch.block_tables.size(), num_seqs, batch.max_blocks_per_seq, table_entries));
  }
}

std::vector<TokenPosition> token_positions(const Batch& batch, std::int64_t num_tokens) {
  validate_batch(batch, num_tokens);
  std::vector<TokenPosition> positions;
  positions.reserve(static_cast<std::size_t>(num_tokens));
  for (int s = 0; s < batch.num_seqs(); ++s) {
    // Token i of the sequence's chunk is at context_len + i (spec section 4).
    for (int row = batch.query_starts[s]; row < batch.query_starts[s + 1]; ++row) {
      positions.push_back(
          {s, static_cast<std::int64_t>(batch.context_lens[s]) + (row - batch.query_starts[s])});
    }
  }
  return positions;
}

std::int64_t slot_of(const Batch& batch, int seq, std::int64_t position, int block_size,
                     std::int64_t num_blocks) {
  if (block_size <= 0)
    throw Error(Stage::input, fmt::format("block_size is {}; it must be positive", block_size));
  if (seq < 0 || seq >= batch.num_seqs() || position < 0) {
    throw Error(Stage::internal,
                fmt::format("slot_of(sequence {}, position {}) outside a batch of {} sequences", seq,
                            position, batch.num_seqs()));
  }
  const std::int64_t logical_block = position / block_size;
  if (logical_block >= batch.max_blocks_per_seq) {
    throw Error(Stage::input,
                fmt::format("sequence {}: position {} needs logical block {}, beyond max_blocks_per_seq = {} "
                            "(at most {} positions with block_size {})",
                            seq, position, logical_block, batch.max_blocks_per_seq,
                            static_cast<std::int64_t>(batch.max_blocks_per_seq) * block_size, block_size));
  }
  const int page = batch.block_table(seq, logical_block);
  if (page < 0 || page >= num_blocks) {
    throw Error(Stage::input, fmt::format("block_tables[{}][{}] is {}, outside the cache's pages [0, {})",
                                          seq, logical_block, page, num_blocks));
  }
  return static_cast<std::int64_t>(page) * block_size + position % block_size;
}

}  // namespace attnplan::reference
