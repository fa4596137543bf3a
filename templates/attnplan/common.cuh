// Device helpers shared by the kernel templates: 16-byte bf16 vectors, bf16 pairs and block reductions.
#pragma once

#include <cuda_bf16.h>

#include "attnplan/params.h"
#include "attnplan/vector_width.h"  // vector_width_for, shared with the host heuristics

namespace attnplan::kernels {

// The sequence that owns token `token`: the last s with query_starts[s] <= token (binary search).
__device__ __forceinline__ int sequence_of_token(const int* query_starts, int num_seqs, int token) {
  int low = 0, high = num_seqs - 1;
  while (low < high) {
    const int mid = (low + high + 1) / 2;
    if (query_starts[mid] <= token)
      low = mid;
    else
      high = mid - 1;
  }
  return low;
}

// N bf16 values moved as one aligned access of 2N bytes.
template <int N>
struct alignas(2 * N) BF16Vector {
  __nv_bfloat16 values[N];

  __device__ static BF16Vector load(const bf16_bits* base, long long index) {
    return *reinterpret_cast<const BF16Vector*>(base + index);
  }
  __device__ void store(bf16_bits* base, long long index) const {
    *reinterpret_cast<BF16Vector*>(base + index) = *this;
  }
};

// Two floats as a bf16 pair (round to nearest), `low` in the low half: the element order of fragments.
__device__ __forceinline__ unsigned pack_bf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const unsigned*>(&pair);
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// `value` combined with `op` over the 32 lanes of a warp (a butterfly: every lane gets the result).
template <class Op>
__device__ __forceinline__ float warp_reduce(float value, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

__device__ __forceinline__ float warp_sum(float value) {
  return warp_reduce(value, SumOp{});
}

// `value` combined with `op` over all threads of a block of kThreads (a multiple of 32); every thread gets
// the result (`identity` stands in for the lanes past the block's warps). One shared array per
// instantiation, so a kernel calls each of block_sum and block_max once: a second call could overwrite a
// warp's entry before every warp has read the first.
template <int kThreads, class Op>
__device__ __forceinline__ float block_reduce(float value, Op op, float identity) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "a block reduction needs whole warps");
  constexpr int kWarps = kThreads / 32;
  value = warp_reduce(value, op);
  if constexpr (kWarps == 1) {
    return value;
  } else {
    __shared__ float partial[kWarps];
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    if (lane == 0) partial[warp] = value;
    __syncthreads();
    return warp_reduce(lane < kWarps ? partial[lane] : identity, op);
  }
}

template <int kThreads>
__device__ __forceinline__ float block_sum(float value) {
  return block_reduce<kThreads>(value, SumOp{}, 0.0f);
}

template <int kThreads>
__device__ __forceinline__ float block_max(float value) {
  return block_reduce<kThreads>(value, MaxOp{}, __int_as_float(0xff800000));  // -infinity
}

}  // namespace attnplan::kernels
