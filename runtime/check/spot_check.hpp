// The check `attnplan bench` runs before it times a plan: one observed run, whose attention output is
// compared with the double-precision reference at a sample of token rows. A benchmark that times a wrong
// kernel reads as a speed-up (an A/B of a broken change most of all); the full check (`attnplan verify`,
// check::run_case) costs minutes of CPU at the benchmark's 16k tokens, this one about a second.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "check/layer_check.hpp"
#include "plan/prefill_plan.hpp"
#include "reference/batch.hpp"

namespace attnplan::check {

struct SpotCheck {
  std::vector<std::int64_t> rows;  // the token rows compared, every query head of each
  // The GPU's attention output at those rows against reference::attention_rows of the GPU's own queries
  // (after its q norm and RoPE) and KV cache (after its store): the attention kernel alone is judged.
  double relative_l2 = 0;
  double tolerance = 0;
  std::size_t attention_unwritten = 0;  // attention output elements still poisoned, over the whole chunk
  std::size_t output_unwritten = 0;     // layer output elements still poisoned
  std::size_t output_non_finite = 0;    // layer output elements NaN or infinite, the poison aside
  bool passed() const;
};

// The rows a spot check compares (pure): the first and the last row of each sequence, as many sequences
// as max_rows allows, then rows evenly spaced over the whole chunk until max_rows; sorted, no repeats.
// Error(input) unless max_rows >= 1.
std::vector<std::int64_t> spot_rows(const reference::Batch& batch, int max_rows);

// Poisons the attention region of args.workspace and args.output, runs `plan` once on `args` (on its own
// stream, every stage observed), then compares the spot_rows(layer.batch, max_rows). `args` must run the
// case `layer` describes (its batch, spans and weights); its KV pool is read back after the run, so the
// prefix slots must hold what layer.key_cache / value_cache hold (quantized, with an fp8 cache).
SpotCheck spot_check(const plan::PrefillPlan& plan, const LayerCase& layer, const plan::ExecuteArgs& args,
                     int max_rows, double tolerance = 1e-2);

}  // namespace attnplan::check
