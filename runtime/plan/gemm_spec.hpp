// The bf16 projection GEMM (QKV and output projections): its tile heuristic, its typed kernel spec, and
// the host-side checks of its Params against the spec. Template: templates/attnplan/gemm.cuh.
#pragma once

#include "attnplan/gemm_params.h"
#include "compiler/kernel_source.hpp"
#include "config/attention_config.hpp"
#include "config/target.hpp"
#include "driver/launch.hpp"

namespace attnplan::plan {

// The CTA tile of C, its K slice per pipeline stage, the warp grid inside the CTA and the pipeline depth.
struct GemmTiling {
  int block_m = 128;
  int block_n = 128;
  int block_k = 32;
  int warps_m = 2;  // warps along M; each owns block_m / warps_m rows
  int warps_n = 4;  // warps along N; each owns block_n / warps_n columns
  int stages = 4;   // cp.async pipeline depth (stages - 1 K slices in flight)

  int threads() const { return 32 * warps_m * warps_n; }
  friend bool operator==(const GemmTiling&, const GemmTiling&) = default;
};

// The tiling for an [m_hint, k] x [k, n] product on `arch`. Pure. Candidates: 128x128x32 (8 warps) for
// large M, 64x128x64 and 64x64x64 (4 warps) when fewer, shorter CTAs finish sooner. Each candidate's time is
// estimated from the busiest SM's share of tiles, run in rounds of as many CTAs as the SM holds, each round
// bounded below by one CTA's latency over K and by the SM's throughput (constants measured on an H200);
// the fastest wins. `m_hint` is the M the plan expects: launches may use any M (the kernel is correct for
// every M, the hint only steers speed).
GemmTiling choose_gemm_tiling(int m_hint, int n, int k, config::Arch arch);

// SMs of a typical part of `arch` (A100: 108, L40S/4090 class: 128, H100/H200 SXM: 132), the wave size
// the heuristic rounds to. A guess for unknown archs.
int typical_sm_count(config::Arch arch);

// Whether the mma.sync GEMM has a weight loader policy for `encoding` (gemm.cuh): bf16, fp8 with bf16
// activations (any scale granularity), mxfp8, mxfp4 and nvfp4. packed_integer, affine and fp8 activations
// are not implemented yet.
bool gemm_supports(const config::WeightEncoding& encoding);

struct GemmSpec {
  int segments = 1;       // weight segments along N (1: fused or single weight, 3: q | k | v)
  bool has_bias = false;  // any segment has a bias (a segment's null bias then reads as zeros)
  GemmTiling tiling;
  config::WeightEncoding weights;  // the format of W; the loader policy is picked from it at JIT time

  compiler::KernelSource source() const;

  int threads() const { return tiling.threads(); }
  // What the launch needs, and what driver::Function::set_max_dynamic_shared_bytes must allow at load
  // (all three heuristic tilings need more than 48 KiB: 64, 72 and 64 KiB).
  int dynamic_shared_bytes() const;
  // grid [ceil(m / block_m) * ceil(n / block_n)], block [threads], dynamic_shared_bytes. m, n > 0.
  driver::LaunchShape launch_shape(int m, int n) const;

  // Throws Error(input) naming the field when `params` breaks the kernel's preconditions: negative
  // sizes, K or a stride not a multiple of 8, lda < K, ldc < N, null or non-16-byte-aligned A, C or
  // weights, segments that do not tile [0, N) in order with `segments` non-empty pieces, a bias pointer
  // on a spec without bias, a misaligned bias; quantized weights: K not a multiple of the values of one
  // 16-byte packed chunk (fp8 16, fp4 32), a segment without scales (nvfp4: without scale_2), scales not
  // 4-byte aligned where they are f32. Nothing to check (and nothing to launch) when M or N is 0.
  void check(const GemmParams& params) const;
};

}  // namespace attnplan::plan
