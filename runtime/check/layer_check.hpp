// One layer's prefill on the device against the double-precision reference, stage by stage: what
// `attnplan verify` runs and what the GPU suite runs for each config. Random weights and inputs from a
// seed, a batch over a shuffled page pool with a random cached prefix, poisoned outputs and cache slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "config/attention_config.hpp"
#include "config/limits.hpp"
#include "io/layer_weights.hpp"
#include "plan/prefill_plan.hpp"
#include "reference/layer.hpp"

namespace attnplan::check {

// bf16 0xFFFF is a NaN: a poisoned element a kernel forgot to write can never pass for a value.
inline constexpr std::uint16_t kPoisonBits = 0xFFFF;
// The same for an fp8 KV pool: e4m3fn 0xFF is a NaN, and the fp8 store never writes it from finite values.
inline constexpr std::uint8_t kPoisonCode = 0xFF;

// The most positions (cached prefix + chunk) one sequence of a scenario may hold: the max_tokens cap.
inline constexpr long long kMaxScenarioPositions = config::limits::kMaxTokens;

struct Scenario {
  int tokens = 256;  // chunk tokens over all sequences
  int seqs = 1;      // sequences sharing them (each gets at least one)
  int prefix = 0;    // tokens already cached per sequence (sequence s gets prefix + 7 s when prefix > 0)
  std::uint64_t seed = 1;
  std::vector<int> chunk_lens;    // explicit split of `tokens` (overrides the random split)
  std::vector<int> context_lens;  // explicit prefixes (override `prefix`)
  // With the config's bidirectional_spans: one span over each sequence's whole chunk (its rows see all of
  // the chunk and the cached prefix: non-causal attention) rather than one inside it (Gemma 3's image
  // tokens). Refused without bidirectional_spans.
  bool bidirectional = false;
};

// Everything one run needs, on the host: weights and input as bf16 bits, the batch, the spans and the
// initial page pools (random prefix slots, poison everywhere else).
struct LayerCase {
  config::AttentionConfig config;
  io::HostLayerWeights weights;
  std::vector<std::uint16_t> input;  // [T, hidden]
  reference::Batch batch;
  reference::Spans spans;
  int num_blocks = 0;
  int max_query_len = 0;
  std::vector<std::uint16_t> key_cache;    // [num_blocks, block_size, Hkv, D]
  std::vector<std::uint16_t> value_cache;  // [num_blocks, block_size, Hkv, Dv]
  // kv_cache.dtype fp8_e4m3: the scales the run passes (random_case: the config's). The pools above are
  // then the prefix's bf16 values, quantized with these scales by run_case (poison becomes code 0xFF).
  std::optional<reference::KvFp8Scales> fp8;
  int num_tokens() const { return batch.query_starts.back(); }
};

// A case's KV pools as a run starts from them: its bf16 pools, or with an fp8 cache their codes
// (quantize_kv_pool_fp8 with the case's scales; a poisoned slot becomes kPoisonCode), quantized once however
// many times they are uploaded. Holds a reference to `layer`.
struct InitialKvPools {
  explicit InitialKvPools(const LayerCase& layer);
  std::span<const std::byte> key() const;  // the bytes to upload
  std::span<const std::byte> value() const;
  const LayerCase& layer;
  std::vector<std::uint8_t> key_codes, value_codes;  // an fp8 cache only
};

// Random weights (projections ~ N(0, 1/hidden) so activations stay O(1); norm weights around 1, or
// around 0 with weight_offset 1; biases and sinks O(1)) and a random batch following `scenario`.
LayerCase random_case(const config::AttentionConfig& config, const Scenario& scenario);

// The reference's view of a case's weights (double, q/k/v as HF stores them).
reference::LayerWeights reference_weights(const LayerCase& layer);

struct StageResult {
  std::string stage;
  double relative_l2 = 0;
  double tolerance = 0;
  bool passed() const { return relative_l2 <= tolerance; }
};

struct Report {
  // normed, q, k, v, q_final, k_final, v_final, kv_cache, attention, output; with fp8 activations q, k, v
  // and output face the reference projection of the GPU's own stage input (run_case says why), and
  // output_chained (fp8 output projection only) the chained reference at 3x the tolerance.
  std::vector<StageResult> stages;
  std::size_t unwritten = 0;            // output elements still poisoned
  std::size_t cache_slots_damaged = 0;  // slots outside the chunk that changed, or chunk slots left poisoned
  double device_ms = 0;                 // execute() alone, events around it
  bool passed() const;
};

// Runs `plan` on `layer` (every stage observed), the reference on the same data, and compares.
// `tolerance` bounds every stage's relative L2 error.
Report run_case(const plan::PrefillPlan& plan, const LayerCase& layer, double tolerance = 1e-2);

}  // namespace attnplan::check
