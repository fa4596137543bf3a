// The bf16 projection GEMM (QKV and output projections): its kernel and tile heuristics, its typed kernel
// spec, and the host-side checks of its Params against the spec. Templates: templates/attnplan/gemm.cuh
// (mma.sync, every arch), templates/attnplan/gemm_sm90.cuh (TMA + wgmma, sm_90a only) and
// templates/attnplan/gemm_sm90_w4.cuh (4-bit weights as wgmma's register A operand, sm_90a only).
#pragma once

#include <cuda.h>

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "attnplan/gemm_params.h"
#include "attnplan/gemm_sm90_decode_params.h"
#include "attnplan/gemm_sm90_params.h"
#include "attnplan/gemm_sm90_w4_params.h"
#include "compiler/kernel_source.hpp"
#include "config/attention_config.hpp"
#include "config/target.hpp"
#include "driver/launch.hpp"
#include "plan/qkv_postprocess_spec.hpp"

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

// Which template computes the GEMM.
enum class GemmKernel {
  mma_sync,  // gemm.cuh: cp.async + mma.sync m16n8k16, sm_80 and later
  wgmma,     // gemm_sm90.cuh: TMA + wgmma, warp-specialized and persistent, sm_90a only
  wgmma_w4,  // gemm_sm90_w4.cuh: the same structure for 4-bit weights (register A operand), sm_90a only
  // gemm_sm90_decode.cuh: the wgmma kernel whose decoder warpgroups decode 4- or 8-bit weight codes into
  // its W slots (bf16 in shared memory, both wgmma operands from there), sm_90a only. Planned for the
  // short launches of the 4-bit formats it reads (sm90_decode_gemm_planned).
  wgmma_decode,
};

std::string_view gemm_kernel_name(GemmKernel kernel);  // "mma_sync", "wgmma", "wgmma_w4", "wgmma_decode"

// The sm_90a kernels' shape: tile [128, block_n] of C, K slices of 64, a ring of `stages` slots. For
// wgmma_w4 the tile is [block_n tokens, 128 weight rows] (block_n is then the token tile, the wgmma N).
struct GemmSm90Tiling {
  int block_n = 256;  // 128, 160, 192 or 256: the wgmma N of each consumer warpgroup (wgmma_w4: 128 or 256)
  // Ring slots of [128 + block_n, 64] bf16: 4 x 48 KiB at 256, 4 x 40 at 192, 5 x 36 at 160, 6 x 32 at 128.
  int stages = 4;
  // CTAs per cluster along M (bf16 wgmma and wgmma_decode kernels): 2 = pairs of vertically adjacent tiles
  // share each W slice by TMA multicast (gemm_sm90.cuh; wgmma_decode: each CTA decodes its share and copies
  // it to the others, which also allows 4), 1 = no clusters.
  int cluster_m = 1;
  // wgmma_decode only: slots of codes [block_n / cluster_m, 64] in flight beside the ring
  // (gemm_sm90_decode_tiling).
  int code_stages = 0;

  friend bool operator==(const GemmSm90Tiling&, const GemmSm90Tiling&) = default;
};

struct GemmKernelChoice {
  GemmKernel kernel = GemmKernel::mma_sync;
  GemmSm90Tiling sm90;  // meaningful for GemmKernel::wgmma

  friend bool operator==(const GemmKernelChoice&, const GemmKernelChoice&) = default;
};

// The kernel for an [m_hint, k] x [k, n] product whose weight is split along N into `segment_widths`
// (in order; they sum to n). Pure. wgmma only on sm_90a (the architecture-specific target: plain sm_90
// has no wgmma) with a block_n the segments allow: every width but the last a multiple of block_n for 128
// and 256, of 32 for 160 and 192 (whose tiles straddle segments in 32-row W pieces). Of those, the least
// gemm_sm90_cost at m_hint, the wider on a tie: 256 (the better rate per tile) unless a narrower one needs
// fewer rounds of tiles over the SMs by more than the 10% it costs per column (160 and 192 exist for N =
// 5120 and 6144 at few tokens: one round of 128 tiles where 256 leaves a third of the SMs idle). Otherwise
// mma_sync (then choose_gemm_tiling picks its tiling).
GemmKernelChoice choose_gemm_kernel(config::Arch arch, int m_hint, int n, int k,
                                    std::span<const int> segment_widths);

// Whether the wgmma kernel's `block_n` tiles may run over these segment widths: every width but the last
// a multiple of block_n (128, 256), or of 32 (160, 192: W in 32-row pieces; gemm_sm90_tiles_straddle).
// GemmSpec::check applies the same rule to Params. Pure.
bool gemm_sm90_segments_fit(std::span<const int> segment_widths, int block_n);

// Whether `encoding` is AWQ's packed words ([K, N / 8], packed along N), as opposed to GPTQ's [K / 8, N].
bool is_awq(const config::WeightEncoding& encoding);

// Whether the decoding wgmma kernel (wgmma_decode) reads `encoding`: codes in rows of bytes [N, K * bits
// / 8] in k order — mxfp4, nvfp4, 4-bit affine (groups 32, 64, 128), fp8 weight-only (any scale
// granularity), mxfp8 — AWQ's 4-bit words [K, N / 8] (a decoder thread takes 8 rows x 8 k of one word
// column) in groups of a multiple of 64 or per channel, or GPTQ's 4-bit words [K / 8, N] without act order
// (a unit is 4 words of one row's column) in groups of a multiple of 32 or per channel.
bool sm90_decode_gemm_supports(const config::WeightEncoding& encoding);

// Whether a CTA's share of a block_n-wide tile in clusters of cluster_m (block_n / cluster_m rows) is whole
// 32-row pieces, as AWQ's code boxes on the decoding kernel must be (rows of N / 8 words: 16-byte TMA
// boxes). Pure.
bool sm90_decode_awq_share_fits(int block_n, int cluster_m);

// Whether the plan gives `encoding`'s projections the decoding kernel for launches below
// dequantized_min_tokens, in place of wgmma_w4: the 4-bit formats it reads (mxfp4, nvfp4, 4-bit affine,
// AWQ, GPTQ without act order).
// On the H200 it ran their projections 1.2-2.3x faster than wgmma_w4 at 256 tokens, and their plans' layer
// 1.2-2.4x faster at 64-400 tokens. The 8-bit formats keep wgmma_w4, which is ahead on Llama-3.1-8B's q|k|v
// (0.0607 against 0.0700 ms at 512 tokens; docs/kernels-notes.md, "Session 19"). Pure.
bool sm90_decode_gemm_planned(const config::WeightEncoding& encoding);

// The decoding kernel's ring for block_n-wide tiles (128, 160, 192) of `bits`-bit codes in clusters of
// cluster_m, in 227 KiB: 4 ring slots, so that four decoder teams take them in turn (gemm_sm90_decode.cuh;
// one team decoding every slice was 1.3-1.4x slower, two 1.1x, session 18), with 4 code slots (3 slices of
// codes in flight ahead of the decoders: the loads come from HBM) where they fit, else 2. A code slot holds
// the CTA's share of a slice (block_n / cluster_m rows), so 8-bit codes at 192 get 4 + 2 alone and 4 + 4 in
// clusters. Pure.
GemmSm90Tiling gemm_sm90_decode_tiling(int block_n, int bits, int cluster_m = 1);

// The decoding kernel for a quantized [m_hint, k] x [k, n] product on `arch` (segments as in
// choose_gemm_kernel), or mma_sync where it cannot run: sm_90a, a format it reads, K a multiple of 128 /
// bits, segments the tiles allow. block_n: the least gemm_sm90_cost of 192, 160 and 128 (the consumers
// are the bf16 kernel's; 256 leaves the decoders too few registers), the wider on a tie; clusters of 2
// along M from two row tiles (128 rows each) up; the ring is gemm_sm90_decode_tiling's. Pure.
GemmKernelChoice choose_decode_gemm_kernel(const config::WeightEncoding& encoding, config::Arch arch,
                                           int m_hint, int n, int k, std::span<const int> segment_widths);

// The switch of the sm_90a mixed-input kernel (wgmma_w4): when false, choose_w4_gemm_kernel never picks it
// and 4-bit projections stay on the mma.sync kernel. One place to turn it off if it misbehaves on a GPU.
bool sm90_w4_gemm_enabled();

// Whether the wgmma_w4 kernel has a loader for `encoding`: 4-bit codes in k order, two per byte, low
// nibble first: rows of bytes [N, K / 2] (mxfp4, nvfp4, affine with bits 4) or GPTQ / GPTQ v2 words
// [K / 8, N] or AWQ words [K, N / 8] (bits 4, no act order, group -1 or a multiple of 16 that divides or
// is divided by 64); 8-bit e4m3fn codes, rows of bytes [N, K] (fp8 with bf16 activations, any scale
// granularity; mxfp8).
bool sm90_w4_gemm_supports(const config::WeightEncoding& encoding);

// The kernel for a quantized [m_hint, k] x [k, n] product on `arch` (segments as in choose_gemm_kernel).
// Pure. wgmma_w4 when enabled, on sm_90a, for a format it supports, with every
// segment but the last a multiple of 128 rows (AWQ: every segment a multiple of 32) and K a multiple of 32
// (4-bit) or 16 (8-bit); block_n (the token tile) 256 with 6 slots (5 for 8-bit codes) unless 128 with 8
// needs fewer rounds of tiles over the SMs by more than the 10% it costs per token. Otherwise mma_sync.
GemmKernelChoice choose_w4_gemm_kernel(const config::WeightEncoding& encoding, config::Arch arch, int m_hint,
                                       int n, int k, std::span<const int> segment_widths);

// The wgmma kernel's estimated time for M = m, N = n on `sms` SMs, in relative units: the busiest SM's
// rounds of [128, block_n] tiles times a tile's time (proportional to block_n; a narrower tile does
// ~10% less per column, 160 ~15%: the A slice is re-read per tile and the epilogue share is larger). Pure.
double gemm_sm90_cost(int m, int n, const GemmSm90Tiling& tiling, int sms);

// Tokens a second wgmma specialization of a projection is planned for: a plan built for max_tokens (8k)
// also serves short chunks, whose few row tiles leave SMs idle with the max_tokens tiling (issue #6:
// 0.49-0.84x cuBLAS at 512 tokens). plan_kernels compiles choose_gemm_kernel(arch, kSmallLaunchTokens, ...)
// beside the max_tokens choice when their tilings differ; each launch picks one with choose_gemm_variant.
inline constexpr int kSmallLaunchTokens = 512;

// The same for the decoding kernel (wgmma_decode), whose planned specialization is tiled for
// kDecodeTiledTokens: at 256 tokens Llama-3.1-8B's q|k|v ran 1.19x faster 128 wide than with the 192-wide
// tiles that 511 tokens get (H200, session 19: 0.0489 against 0.0581 ms, mxfp4).
inline constexpr int kDecodeSmallLaunchTokens = 256;

// And a third for one row tile, where the tiling for 128 tokens differs from both: at 64 tokens
// Llama-3.1-8B's q|k|v ran 1.21x faster in 64-wide unclustered tiles (96 CTAs) than in the 256-token
// specialization's 128 x2 (48 tiles; H200, session 20: 0.0409 against 0.0496 ms, mxfp4), gpt-oss-20b's
// 1.11x (0.0341 against 0.0380).
inline constexpr int kDecodeTinyLaunchTokens = 128;

// The launch length the decoding kernel's planned specialization is tiled for: the longest it always
// runs (decode_dequantized_min_tokens is at least 512). Longer launches that it still takes fit that
// tiling's one wave by construction.
inline constexpr int kDecodeTiledTokens = 511;

// Which of a projection's two compiled wgmma tilings one launch of M = m rows runs.
struct GemmVariantChoice {
  bool small = false;                       // true: the kSmallLaunchTokens specialization
  double planned_cost = 0, small_cost = 0;  // gemm_sm90_cost of each, for tests and logs
};

// Pure: the cheaper of the two by gemm_sm90_cost on `multiprocessors` SMs (typical_sm_count of sm_90
// when 0); the planned one on a tie.
GemmVariantChoice choose_gemm_variant(int m, int n, const GemmSm90Tiling& planned,
                                      const GemmSm90Tiling& small, int multiprocessors);

// Whether the mma.sync GEMM has a weight loader policy for `encoding` (gemm.cuh): bf16, fp8 with bf16
// activations (any scale granularity), mxfp8, mxfp4 and nvfp4. packed_integer, affine and fp8 activations
// are not implemented yet.
bool gemm_supports(const config::WeightEncoding& encoding);

struct GemmSpec {
  int segments = 1;       // weight segments along N (1: fused or single weight, 3: q | k | v)
  bool has_bias = false;  // any segment has a bias (a segment's null bias then reads as zeros)
  GemmTiling tiling;      // the mma_sync kernel's tiling
  GemmKernel kernel = GemmKernel::mma_sync;
  GemmSm90Tiling sm90;             // the wgmma kernel's tiling
  config::WeightEncoding weights;  // the format of W; the loader policy is picked from it at JIT time
  // The q|k|v projection's postprocess (per-head norms, RoPE) done by the epilogue: the bf16 wgmma kernel
  // only, where postprocess->fits_gemm_epilogue(sm90.block_n) (plan_kernels). Its launches take
  // GemmQkvEpilogueParams, and the plan runs no postprocess kernel after them.
  std::optional<QkvPostprocessSpec> postprocess;

  compiler::KernelSource source() const;

  int threads() const;
  // What the launch needs, and what driver::Function::set_max_dynamic_shared_bytes must allow at load
  // (all heuristic tilings need more than 48 KiB: mma_sync 64, 72 and 64 KiB; wgmma 193 KiB).
  int dynamic_shared_bytes() const;
  // mma_sync: grid [ceil(m / block_m) * ceil(n / block_n)]. wgmma: persistent, grid [min(tiles,
  // multiprocessors)] (typical_sm_count of sm_90 when multiprocessors is 0). block [threads],
  // dynamic_shared_bytes. m, n > 0.
  driver::LaunchShape launch_shape(int m, int n, int multiprocessors = 0) const;

  // Throws Error(input) naming the field when `params` breaks the kernel's preconditions: negative
  // sizes, K or a stride not a multiple of 8, lda < K, ldc < N, null or non-16-byte-aligned A, C or
  // weights, segments that do not tile [0, N) in order with `segments` non-empty pieces, a bias pointer
  // on a spec without bias, a misaligned bias; for wgmma also a segment other than the last whose width
  // is not a multiple of block_n; quantized weights: K not a multiple of the values of one 16-byte packed
  // chunk (fp8 16, fp4 32), a segment without scales (nvfp4: without scale_2), scales not 4-byte aligned
  // where they are f32. Nothing to check (and nothing to launch) when M or N is 0.
  void check(const GemmParams& params) const;
};

// The wgmma kernel's Params for `params` (checked by spec.check first): `params` plus one TMA tensor map
// for A and one per weight segment, encoded with cuTensorMapEncodeTiled — a host-only driver call that
// neither allocates nor synchronizes, so it is legal per launch and during stream capture.
// With spec.postprocess, `qkv_epilogue` carries its run-time values (the rotation table, the norm weights,
// epsilon) and must not be null.
GemmSm90Params make_gemm_sm90_params(const GemmSpec& spec, const GemmParams& params,
                                     const GemmQkvEpilogueParams* qkv_epilogue = nullptr);

// `qkv_epilogue`'s values for a GEMM whose epilogue runs `post` (the bf16 and the fp8 wgmma kernels).
// Throws Error(input) naming the field when they are missing or what `post` reads is null.
GemmQkvEpilogueParams checked_qkv_epilogue(const QkvPostprocessSpec& post,
                                           const GemmQkvEpilogueParams* qkv_epilogue);

// The wgmma_w4 kernel's Params (gemm_sm90_w4_params.h): `params` plus the tensor maps of X and of each
// segment's codes.
GemmSm90Params make_gemm_sm90_w4_params(const GemmSpec& spec, const GemmParams& params);

// The wgmma_decode kernel's Params (gemm_sm90_decode_params.h): the bf16 kernel's A and C maps and one map
// of each segment's code bytes.
GemmSm90Params make_gemm_sm90_decode_params(const GemmSpec& spec, const GemmParams& params);

// Queues spec's kernel for `params` on `stream` (encoding the tensor maps for wgmma). `multiprocessors`:
// the device's SM count (the wgmma kernel's persistent grid). `qkv_epilogue`: the fused postprocess's
// values, required when spec.postprocess is set (Error(input) otherwise: a null table where it rotates, a
// null norm weight it reads), ignored when not. Nothing is launched when M or N is 0.
void launch_gemm(const driver::Function& function, const GemmSpec& spec, const GemmParams& params,
                 CUstream stream, int multiprocessors, const GemmQkvEpilogueParams* qkv_epilogue = nullptr);

// The dequantized path of a weight-only quantized projection (sm_90a): the dequantize kernel
// (dequantize.cuh) writes W [N, K] as bf16 into the workspace, then the bf16 wgmma GEMM reads it like a
// bf16 checkpoint. At thousands of tokens the projection is compute-bound and the bf16 kernel runs at
// ~700 TFLOP/s where the mixed-input kernel (wgmma_w4) decodes on the wgmma's critical path at 300-620;
// the rewrite of W costs one memory-bound pass the GEMM amortizes over M (docs/kernels-notes.md).
//
// Pure. Launches of at least this many rows take the path, shorter ones the quantized kernel. Measured on
// the H200 (`test_gpu "[.gemm_w4_speed]"`, Llama-3.1-8B's q|k|v, 512 tokens, session 9): 512 where the
// short-launch kernel is behind the path there — wgmma_w4's nvfp4 decode (0.122 against 0.083), mxfp4
// (0.088 against 0.081) and AWQ (0.088 against 0.085) — and 1024 for the others, which tie or win at 512
// (mxfp8 0.083 both ways; GPTQ, MLX affine and fp8 block ahead by 4-23%) and so keep the workspace the path
// needs for plans of fewer tokens. Since session 19 the short launches of the 4-bit formats in rows of
// bytes run the decoding kernel (sm90_decode_gemm_planned); the switch points stayed (at 512 tokens it is
// 0.87-1.06x the dequantized path for mxfp4 and nvfp4). 1 for formats without a wgmma_w4 member, whose
// short launches would run mma.sync: from 1 to 511 tokens (`attnplan bench`, session 23) act-order GPTQ's
// q|k|v took 0.32-0.46 ms there against 0.077-0.078 on the path, o 0.30 against 0.065, MLX 3-bit's 0.19-0.26
// and 0.17 against 0.070 and 0.058: the path's rewrite plus a bf16 GEMM beat it at every length.
int dequantized_min_tokens(const config::WeightEncoding& weights);

// The same for a projection planned on the decoding kernel (`decode`, its planned tiling; N = n) on `sms`
// SMs: the fewest rows whose tiles (in whole clusters) no longer fit one wave, within [512, 1024]. In one
// wave the decoder reads 4-bit codes where the path rewrites the whole W to bf16 first; from the second
// wave on, the path's bf16 GEMM, which decodes nothing, catches up. Measured on the H200 (session 21,
// `attnplan bench`, weights from HBM): at 512 tokens the decoding kernel took Llama-3.1-8B nvfp4's q|k|v
// and o in 0.81x and 0.72x the path's time (one wave each: 128 tiles), gpt-oss-20b mxfp4's o in 0.87x and
// its q|k|v in 1.06x; at 768 tokens (two waves) the o projections took 1.25x. Llama-3.1-8B: 513, where
// the format rule gave 512 (nvfp4, mxfp4) or 1024 (MLX affine). Pure.
int decode_dequantized_min_tokens(const GemmSm90Tiling& decode, int n, int sms);

// The fewest rows of `quantized`'s dequantized path on `arch`: decode_dequantized_min_tokens on the
// arch's typical_sm_count when `quantized` is planned on the decoding kernel, else dequantized_min_tokens
// of its format. Pure.
int dequantized_min_tokens(const GemmSpec& quantized, config::Arch arch, int n);

// The dequantize kernels (dequantize.cuh). tiles: dequantize_kernel, [64 rows, 64 k] per CTA, every
// format. group_table: dequantize_table_kernel, [64 rows, 512 k] per CTA with its rows' scale and zero of
// every group staged in shared memory, for weights that look up each k's group (act-order GPTQ).
enum class DequantizeKernel { tiles, group_table };

struct DequantizeSpec {
  int segments = 1;
  config::WeightEncoding weights;  // the format; its gemm.cuh loader policy decodes
  DequantizeKernel kernel = DequantizeKernel::tiles;
  int groups = 0;  // group_table: the groups of K its table holds, ceil(K / group_size) (1 per channel)

  compiler::KernelSource source() const;
  // tiles: grid [ceil(n / 64), ceil(k / 64)], no dynamic shared memory; group_table: grid
  // [ceil(n / 64), ceil(k / 512)], dynamic_shared_bytes(). Block [256]. n, k > 0.
  driver::LaunchShape launch_shape(int n, int k) const;
  int dynamic_shared_bytes() const;
  // GemmSpec::check's rules for the quantized Params (params.gemm, as the mma.sync kernel with these
  // weights reads them), and params.weight: null or not 16-byte aligned. group_table also: K's groups
  // are `groups`, every segment but the last a multiple of 64 rows.
  void check(const DequantizeParams& params) const;
};

// The groups a group table holds at most: [groups, 64] float pairs, 512 bytes a group, within 96 KiB.
inline constexpr int kDequantizeTableMaxGroups = 192;

// Pure. The dequantize kernel for a projection of `segments` segments of `weights` over K `k`: group_table
// where the weights look up each k's group (GPTQ with act order), K has at most kDequantizeTableMaxGroups
// groups and every segment but the last is a multiple of 64 rows; tiles otherwise.
DequantizeSpec choose_dequantize(int segments, const config::WeightEncoding& weights, int k,
                                 std::span<const int> segment_widths);

// Pure. The bf16 GEMM of `quantized`'s dequantized path for a plan of up to m_hint rows, or nullopt where
// the path does not apply: not sm_90a, bf16 weights or fp8 activations, a format without an mma.sync
// loader (whose decode the dequantize kernel shares), m_hint below dequantized_min_tokens(quantized, arch,
// n), or segments the wgmma kernel cannot tile (choose_gemm_kernel). Same segments and bias as `quantized`,
// bf16 weights.
std::optional<GemmSpec> choose_dequantized_gemm(const GemmSpec& quantized, config::Arch arch, int m_hint,
                                                int n, int k, std::span<const int> segment_widths);

// The bf16 GEMM's Params on the dequantized path: `quantized` (the projection's Params) with each
// segment's weight at its rows of W [N, K] (`weight`, what the dequantize kernel wrote, row stride K) and no
// scales, zeros or g_idx. Pure; check them with the bf16 GemmSpec.
GemmParams dequantized_gemm_params(const GemmParams& quantized, const bf16_bits* weight);

// Queues the dequantize kernel (params checked by spec.check first). Nothing when N or K is 0.
void launch_dequantize(const driver::Function& function, const DequantizeSpec& spec,
                       const DequantizeParams& params, CUstream stream);

}  // namespace attnplan::plan
