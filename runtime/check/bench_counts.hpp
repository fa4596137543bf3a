// The work each stage of one layer's prefill must do, counted on the host from the config and the batch:
// FLOPs for the compute stages, bytes for the memory-bound ones. `attnplan bench` divides them by the
// measured times; tools/bench_peers.py counts the same way, so ours/peer ratios compare like with like.
// Pure functions, no CUDA.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "config/attention_config.hpp"
#include "plan/kernel_plan.hpp"

namespace attnplan::check {

// The chunk lengths of `seqs` sequences sharing `tokens` new tokens: unequal (sequence i's share grows
// with i + 1, so a varlen batch has short and long sequences) and summing to `tokens`, each >= 1.
// One sequence gets everything. tools/bench_peers.py implements the same rule (varlen_split).
// Error(input) unless 1 <= seqs <= tokens.
std::vector<int> varlen_split(int tokens, int seqs);

// One sequence of the batch as attention sees it: `context_len` cached tokens, then `chunk_len` new ones;
// `spans` are [start, end) absolute positions (bidirectional, sorted, disjoint).
struct SequenceShape {
  int context_len = 0;
  int chunk_len = 0;
  std::vector<std::array<int, 2>> spans;
};

// (query, key) pairs attention must score for one sequence, per query head (spec section 6): query
// positions context_len .. context_len + chunk_len - 1, keys 0 .. context_len + chunk_len - 1; allowed
// when causal (and inside the sliding window W when `window` > 0) or both inside one span.
std::int64_t allowed_pairs(const SequenceShape& sequence, int window);

// The FLOPs and bytes of one stage. flops == 0: memory-bound (report GB/s); otherwise report TFLOP/s.
struct StageWork {
  plan::StageKind stage;
  double flops = 0;  // multiply-adds count 2
  double bytes = 0;  // the least each stage must read plus write in device memory
};

// Every stage of the plan for this batch, in execute order (qkv_postprocess only when the config has
// RoPE or q/k/v norms; output_quantize only before an output projection with fp8 activations,
// memory-bound; the input norm writes fp8 codes instead of bf16 rows for a q|k|v projection with them).
// GEMMs: 2 M N K. Attention: 2 (D + Dv) per allowed pair per query head. Bytes assume bf16 activations and
// weights (quantized weights move fewer; the FLOPs are the same).
std::vector<StageWork> stage_work(const config::AttentionConfig& config,
                                  const std::vector<SequenceShape>& batch);

// Median, fastest and slowest of a set of timings (milliseconds). Error(input) when there are none.
struct Spread {
  double median = 0;  // the mean of the two middle values for an even count
  double min = 0;
  double max = 0;
};
Spread spread(std::vector<double> samples);

// How many copies of the inputs, weights, KV pool and workspace (`set_bytes` each) a benchmark rotates
// through so that no run finds the previous run's data in the L2: enough that they span twice the L2, at
// least 2, at most 64, and never more than half of `free_bytes` (at least 1).
int rotation_sets(std::size_t set_bytes, std::size_t l2_bytes, std::size_t free_bytes);

}  // namespace attnplan::check
