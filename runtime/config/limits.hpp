// The ranges the validator enforces, in one place so heuristics and tests can name them.
// docs/config.md explains each one; change them together.
#pragma once

namespace attnplan::config::limits {

// Kernels move bf16 data in 16-byte vectors (8 elements), so every row the kernels read or write
// (hidden_size, head_dim, value_head_dim) is a whole number of vectors.
inline constexpr int kVectorElements = 8;

inline constexpr int kMaxHiddenSize = 65536;
inline constexpr int kMaxQueryHeads = 1024;
// 16: one bf16 mma k-step. 512: twice the largest head in plans/ (256); past it a query tile's fp32
// output accumulator no longer fits on chip.
inline constexpr int kMinHeadDim = 16;
inline constexpr int kMaxHeadDim = 512;

inline constexpr int kMaxBlockSize = 1024;  // kv_cache.block_size: a power of two in [1, kMaxBlockSize]
inline constexpr int kMaxTokens = 1 << 20;  // max_tokens cap: one execute() of up to 1M tokens

// cp.async, bf16 mma and ldmatrix start at sm_80; native fp8 mma at sm_89.
inline constexpr int kMinArchSm = 80;
inline constexpr int kMinFp8ActivationSm = 89;
// Architecture-specific "a" variants exist from sm_90a on.
inline constexpr int kMinArchSpecificSm = 90;

}  // namespace attnplan::config::limits
