// Typed kernel specs: every compile-time choice of one kernel, as named fields. A spec renders the
// instantiation stub (compiler::KernelSource) that the JIT compiles and the cache keys on.
#pragma once

#include <optional>
#include <string>

#include "compiler/kernel_source.hpp"
#include "config/attention_config.hpp"
#include "plan/heuristics.hpp"

namespace attnplan::plan {

struct RmsNormSpec {
  int hidden_size = 0;
  bool unit_offset = false;  // weight_offset == 1 (Gemma)
  // Also the fp8 codes + scales of an fp8-activation q|k|v projection (rmsnorm.cuh; needs tiling.vector
  // 8, which hidden_size % 16 == 0 gives), so the plan runs no quantizer before that projection: with the
  // scales that projection reads (one per token, or one per token and 128 channels). None: bf16 rows only.
  std::optional<config::Fp8ActivationScales> fp8_codes;
  // Also each token's row of the RoPE rotation table (R / 2 pairs; 0: none) for a q|k|v GEMM that applies
  // RoPE in its epilogue (GemmSpec::postprocess; rmsnorm.cuh).
  int rotary_pairs = 0;
  RmsNormTiling tiling;

  compiler::KernelSource source() const;
};

struct KvStoreSpec {
  int kv_heads = 0;
  int head_dim = 0;
  int value_head_dim = 0;
  int block_size = 0;      // tokens per cache page
  bool fp8_cache = false;  // kv_cache.dtype fp8_e4m3: 1-byte codes, quantized with the run-time scales
  KvStoreTiling tiling;

  compiler::KernelSource source() const;
};

}  // namespace attnplan::plan
