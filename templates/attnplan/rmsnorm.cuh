// Input RMSNorm over one [num_tokens, hidden_size] bf16 activation: one block per token row, the row
// held in registers between the sum-of-squares pass and the scaling pass, 16-byte accesses.
#pragma once

#include "attnplan/common.cuh"

namespace attnplan::kernels {

template <int kHiddenSize, int kThreads, bool kUnitOffset>
struct RmsNormTraits {
  using Params = RmsNormParams;
  static constexpr int hidden_size = kHiddenSize;
  static constexpr int threads = kThreads;
  static constexpr bool unit_offset = kUnitOffset;  // Gemma: scale by (1 + w)
  static constexpr int vector = vector_width_for(kHiddenSize);
  static constexpr int vectors_per_row = kHiddenSize / vector;
  static constexpr int vectors_per_thread = (vectors_per_row + kThreads - 1) / kThreads;

  static_assert(kHiddenSize > 0, "hidden_size must be positive");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "threads must be whole warps, at most 1024");
  static_assert(vectors_per_thread <= 16, "a row must fit in registers: raise threads");
};

// grid: [num_tokens], block: [Traits::threads]
template <class Traits>
__global__ void __launch_bounds__(Traits::threads) rmsnorm_kernel(const RmsNormParams params) {
  using Vector = BF16Vector<Traits::vector>;
  const int token = blockIdx.x;
  if (token >= params.num_tokens) return;
  const long long row = static_cast<long long>(token) * Traits::hidden_size;

  Vector cached[Traits::vectors_per_thread];
  float sum_of_squares = 0.0f;
#pragma unroll
  for (int i = 0; i < Traits::vectors_per_thread; ++i) {
    const int v = threadIdx.x + i * Traits::threads;
    if (v < Traits::vectors_per_row) {
      cached[i] = Vector::load(params.input, row + v * Traits::vector);
#pragma unroll
      for (int e = 0; e < Traits::vector; ++e) {
        const float x = __bfloat162float(cached[i].values[e]);
        sum_of_squares += x * x;
      }
    }
  }
  const float total = block_sum<Traits::threads>(sum_of_squares);
  const float inverse_rms = rsqrtf(total / Traits::hidden_size + params.epsilon);

#pragma unroll
  for (int i = 0; i < Traits::vectors_per_thread; ++i) {
    const int v = threadIdx.x + i * Traits::threads;
    if (v < Traits::vectors_per_row) {
      const Vector weight = Vector::load(params.weight, v * Traits::vector);
      Vector out;
#pragma unroll
      for (int e = 0; e < Traits::vector; ++e) {
        float w = __bfloat162float(weight.values[e]);
        if constexpr (Traits::unit_offset) w += 1.0f;
        out.values[e] = __float2bfloat16(__bfloat162float(cached[i].values[e]) * inverse_rms * w);
      }
      out.store(params.output, row + v * Traits::vector);
    }
  }
}

}  // namespace attnplan::kernels
