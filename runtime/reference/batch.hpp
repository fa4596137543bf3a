// The batch description of spec section 8, on the host, and the position/slot rules every stage of the
// reference shares (spec sections 4-6: positions; section 5: slots).
#pragma once

#include <cstdint>
#include <vector>

namespace attnplan::reference {

struct Batch {
  std::vector<int>
      query_starts;  // [num_seqs + 1]: sequence s owns token rows [query_starts[s], query_starts[s + 1])
  std::vector<int>
      context_lens;  // [num_seqs]: tokens of s already in the cache; its chunk starts at that position
  std::vector<int> block_tables;  // [num_seqs, max_blocks_per_seq], row-major: page of each logical block
  int max_blocks_per_seq = 0;

  int num_seqs() const noexcept { return static_cast<int>(context_lens.size()); }
  int block_table(int seq, std::int64_t logical_block) const {
    return block_tables[static_cast<std::size_t>(seq * static_cast<std::int64_t>(max_blocks_per_seq) +
                                                 logical_block)];
  }
};

// Where a token row sits: its sequence and its absolute position in that sequence.
struct TokenPosition {
  int seq = 0;
  std::int64_t position = 0;
};

// Throws Error(input) naming the field when the batch contradicts itself or `num_tokens`: array sizes,
// query_starts starting at 0, non-decreasing, ending at num_tokens; context_lens >= 0;
// max_blocks_per_seq >= 0. Block table entries are checked where they are used (slot_of).
void validate_batch(const Batch& batch, std::int64_t num_tokens);

// Sequence and position of every token row, in row order (validates the batch first).
std::vector<TokenPosition> token_positions(const Batch& batch, std::int64_t num_tokens);

// The cache slot of `position` in sequence `seq` (spec section 5):
//   block_tables[seq][position / block_size] * block_size + position % block_size.
// Throws Error(input) when the position lies beyond max_blocks_per_seq * block_size or its block table
// entry is outside [0, num_blocks).
std::int64_t slot_of(const Batch& batch, int seq, std::int64_t position, int block_size,
                     std::int64_t num_blocks);

}  // namespace attnplan::reference
