#include "plan/gemm_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "core/error.hpp"
#include "plan/gemm_common.hpp"
#include "plan/tensor_map.hpp"

namespace attnplan::plan {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// A candidate tiling with its timing model, fitted to H200 timings (sm_90, this mma.sync kernel,
// K = 4096, tests/gpu/gemm_gpu_test.cpp): one CTA alone on an SM takes `latency_per_k_tile_us` per K slice
// (the pipeline's dependent round trips: an SM with one CTA is latency-bound), and CTAs sharing an SM
// progress at `macs_per_us` together (the SM's tensor-core / shared-memory throughput for that tile).
struct Candidate {
  GemmTiling tiling;
  double latency_per_k_tile_us;
  double macs_per_us;  // multiply-adds per microsecond per SM when the SM is saturated
  int registers;       // per thread, the most ptxas (CUDA 13.0) gives any of its specializations
};

constexpr Candidate kCandidates[] = {
    // 8 warps as 2 x 4, warp tile 64 x 32; 4 stages of 16 KiB. The best rate once every SM holds two:
    // 370 TFLOP/s at M = 8192 (64x128x64: 310, 128x128x64 with 3 stages: 317).
    {{.block_m = 128, .block_n = 128, .block_k = 32, .warps_m = 2, .warps_n = 4, .stages = 4},
     0.55,
     1.43e6,
     126},
    // 4 warps as 2 x 2, warp tile 32 x 64; 3 stages of 24 KiB. Half the rows, and half the barriers per K
    // of block_k = 32 (which measured 11% slower at M = 300): the pick for a few hundred tokens.
    {{.block_m = 64, .block_n = 128, .block_k = 64, .warps_m = 2, .warps_n = 2, .stages = 3},
     0.66,
     1.19e6,
     177},
    // 4 warps as 2 x 2, warp tile 32 x 32; 4 stages of 16 KiB. The shortest trip over K of one CTA and
    // twice the CTAs of 64x128: the pick for few rows (weight-streaming, small M).
    {{.block_m = 64, .block_n = 64, .block_k = 64, .warps_m = 2, .warps_n = 2, .stages = 4},
     0.60,
     0.85e6,
     91},
};

// Shared memory per SM that CTAs may use, by arch (A100: 164 KiB, sm_86/89: 100 KiB, H100/H200: 228 KiB).
int shared_bytes_per_sm(config::Arch arch) {
  switch (arch.sm()) {
    case 80:
      return 164 * 1024;
    case 90:
      return 228 * 1024;
    default:
      return 100 * 1024;
  }
}

// CTAs of `candidate` one SM holds at once: shared memory (plus the 1 KiB the hardware reserves per CTA)
// and registers (allocated 8 per thread at a time, 64 K per SM) both cap it.
std::int64_t resident_ctas(const Candidate& candidate, config::Arch arch) {
  const GemmTiling& t = candidate.tiling;
  const int shared = gemm_dynamic_shared_bytes(t.block_m, t.block_n, t.block_k, t.stages);
  const std::int64_t by_shared = shared_bytes_per_sm(arch) / (shared + 1024);
  const std::int64_t by_registers = 65536 / ((candidate.registers + 7) / 8 * 8 * t.threads());
  return std::max<std::int64_t>(1, std::min(by_shared, by_registers));
}

void require(bool condition, const std::string& message) {
  if (!condition) throw Error(Stage::input, "gemm: " + message);
}

bool aligned(const void* pointer, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

std::string cxx_bool(bool value) {
  return value ? "true" : "false";
}

// Weight rows every segment but the last must be a multiple of under the wgmma kernel's `block_n`: whole
// tiles (no tile of C straddles two segments), or whole 32-row W pieces where tiles may straddle.
int wgmma_segment_multiple(int block_n) {
  return gemm_sm90_tiles_straddle(block_n) ? kGemmSm90WPieceRows : block_n;
}

// Every width but the last is a whole number of `multiple` rows.
bool segments_fit(std::span<const int> widths, int multiple) {
  for (std::size_t s = 0; s + 1 < widths.size(); ++s) {
    if (widths[s] % multiple != 0) return false;
  }
  return true;
}

using config::WeightFormat;

// Whether the wgmma_w4 kernel can map a weight segment `width` rows wide: AWQ's rows of width / 8 words
// must make 16-byte TMA strides (width a multiple of 32); the other layouts take any width.
bool sm90_w4_width_fits(const config::WeightEncoding& encoding, int width) {
  return !is_awq(encoding) || width % 32 == 0;
}

// Bits per W value in the pipeline: 16 (bf16), 8 (fp8, mxfp8), 4 (mxfp4, nvfp4).
int weight_bits(const config::WeightEncoding& encoding) {
  switch (encoding.format) {
    case WeightFormat::fp8:
    case WeightFormat::mxfp8:
      return 8;
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4:
      return 4;
    case WeightFormat::packed_integer:
    case WeightFormat::affine:
      return encoding.bits;
    default:
      return 16;
  }
}

// Formats whose packed slices the kernel copies as 32-bit words (gemm.cuh): transposed GPTQ / AWQ, MLX.
bool word_copied(const config::WeightEncoding& encoding) {
  return encoding.format == WeightFormat::packed_integer || encoding.format == WeightFormat::affine;
}

// The loader policy type of gemm.cuh for `encoding` (gemm_supports checked).
std::string weight_policy(const config::WeightEncoding& encoding) {
  switch (encoding.format) {
    case WeightFormat::fp8:
      return fmt::format("attnplan::kernels::Fp8Weights<{}>", static_cast<int>(encoding.scale_granularity));
    case WeightFormat::mxfp8:
      return "attnplan::kernels::Mxfp8Weights";
    case WeightFormat::mxfp4:
      return "attnplan::kernels::Mxfp4Weights";
    case WeightFormat::nvfp4:
      return "attnplan::kernels::Nvfp4Weights";
    case WeightFormat::packed_integer:
      if (encoding.scheme == config::PackedIntegerScheme::awq)
        return fmt::format("attnplan::kernels::AwqWeights<{}>", encoding.group_size);
      return fmt::format("attnplan::kernels::GptqWeights<{}, {}, {}, {}>", encoding.bits,
                         cxx_bool(encoding.scheme == config::PackedIntegerScheme::gptq_v2),
                         encoding.group_size, cxx_bool(encoding.act_order));
    case WeightFormat::affine:
      return fmt::format("attnplan::kernels::AffineWeights<{}, {}>", encoding.bits, encoding.group_size);
    default:
      return "attnplan::kernels::Bf16Weights";
  }
}

// The "weights" object of a quantized kernel's spec (its cache key): the format, its bits and group, and
// the gemm.cuh policy that decodes it.
nlohmann::json weights_spec(const config::WeightEncoding& weights) {
  return {{"format", config::to_string(weights.format)},
          {"bits", weight_bits(weights)},
          {"group_size", weights.group_size},
          {"policy", weight_policy(weights)}};
}

// Whether the gemm.cuh policy of `encoding` looks up each k's group (gathers_groups_v): GPTQ with act order.
bool gathers_groups(const config::WeightEncoding& encoding) {
  return encoding.format == WeightFormat::packed_integer && !is_awq(encoding) && encoding.act_order;
}

// The groups of K under `encoding`'s group size (-1, per channel: one).
int group_count(const config::WeightEncoding& encoding, int k) {
  return encoding.group_size > 0 ? static_cast<int>(ceil_div(k, encoding.group_size)) : 1;
}

// What a refusal names of a packed_integer encoding beside its format: " (awq, 4 bits)", " (gptq, 4 bits,
// act order)"; nothing for other formats.
std::string packed_integer_detail(const config::WeightEncoding& encoding) {
  if (encoding.format != WeightFormat::packed_integer) return "";
  return fmt::format(" ({}, {} bits{})", config::to_string(encoding.scheme), encoding.bits,
                     encoding.act_order ? ", act order" : "");
}

// The wgmma_w4 kernel's stub: the format's policy of gemm.cuh is its loader.
compiler::KernelSource sm90_w4_source(const GemmSpec& spec) {
  if (!sm90_w4_gemm_supports(spec.weights)) {
    throw Error(
        Stage::input,
        fmt::format(
            "gemm: the wgmma_w4 kernel reads mxfp4, nvfp4, 4-bit affine, 4-bit GPTQ and AWQ without act "
            "order, mxfp8 and fp8 weight-only weights, not {}{}",
            config::to_string(spec.weights.format),
            spec.weights.format == WeightFormat::affine ? fmt::format(" with {} bits", spec.weights.bits)
                                                        : packed_integer_detail(spec.weights)));
  }
  compiler::KernelSource source;
  source.family = "gemm_sm90_w4";
  source.header = "attnplan/gemm_sm90_w4.cuh";
  source.traits = "attnplan::kernels::GemmSm90W4Traits";
  source.kernel = "attnplan::kernels::gemm_sm90_w4_kernel";
  source.grid_constant = true;  // the tensor maps must stay in parameter memory
  source.arguments = {{"block_tokens", std::to_string(spec.sm90.block_n)},
                      {"stages", std::to_string(spec.sm90.stages)},
                      {"segments", std::to_string(spec.segments)},
                      {"has_bias", cxx_bool(spec.has_bias)},
                      {"weights", weight_policy(spec.weights)}};
  source.spec = {{"family", source.family},
                 {"kernel", gemm_kernel_name(spec.kernel)},
                 {"block_tokens", spec.sm90.block_n},
                 {"block_rows", kGemmSm90W4BlockRows},
                 {"block_k", kGemmSm90W4BlockK},
                 {"stages", spec.sm90.stages},
                 {"segments", spec.segments},
                 {"has_bias", spec.has_bias},
                 {"weights", weights_spec(spec.weights)},
                 {"dynamic_shared_bytes", spec.dynamic_shared_bytes()}};
  return source;
}

// The wgmma_decode kernel's stub: the format's policy of gemm.cuh is its decoder.
compiler::KernelSource sm90_decode_source(const GemmSpec& spec) {
  if (!sm90_decode_gemm_supports(spec.weights)) {
    throw Error(Stage::input,
                fmt::format("gemm: the wgmma_decode kernel reads mxfp4, nvfp4, 4-bit affine, mxfp8, fp8 "
                            "weight-only and 4-bit AWQ weights (codes in rows of bytes, or AWQ's words), "
                            "not {}{}",
                            config::to_string(spec.weights.format),
                            spec.weights.format == WeightFormat::affine
                                ? fmt::format(" with {} bits and groups of {}", spec.weights.bits,
                                              spec.weights.group_size)
                                : packed_integer_detail(spec.weights)));
  }
  if (is_awq(spec.weights) && !sm90_decode_awq_share_fits(spec.sm90.block_n, spec.sm90.cluster_m)) {
    throw Error(Stage::input,
                fmt::format("gemm: block_n {} in clusters of {} with AWQ weights on the wgmma_decode kernel "
                            "(a CTA's share, {} rows, must be a multiple of 32: its code boxes are rows "
                            "of N / 8 words, whole 16-byte TMA boxes)",
                            spec.sm90.block_n, spec.sm90.cluster_m, spec.sm90.block_n / spec.sm90.cluster_m));
  }
  constexpr int kWidths[] = {64, 96, 128, 160, 192};
  if (std::find(std::begin(kWidths), std::end(kWidths), spec.sm90.block_n) == std::end(kWidths)) {
    throw Error(Stage::input,
                fmt::format("gemm: block_n {} with the wgmma_decode kernel (64, 96, 128, 160 or 192: the "
                            "consumers' registers and wgmma's N)",
                            spec.sm90.block_n));
  }
  compiler::KernelSource source;
  source.family = "gemm_sm90_decode";
  source.header = "attnplan/gemm_sm90_decode.cuh";
  source.traits = "attnplan::kernels::GemmSm90DecodeTraits";
  source.kernel = "attnplan::kernels::gemm_sm90_decode_kernel";
  source.grid_constant = true;  // the tensor maps must stay in parameter memory
  source.arguments = {{"block_n", std::to_string(spec.sm90.block_n)},
                      {"stages", std::to_string(spec.sm90.stages)},
                      {"code_stages", std::to_string(spec.sm90.code_stages)},
                      {"segments", std::to_string(spec.segments)},
                      {"has_bias", cxx_bool(spec.has_bias)},
                      {"weights", weight_policy(spec.weights)}};
  if (spec.sm90.cluster_m != 1)
    source.arguments.push_back({"cluster_m", std::to_string(spec.sm90.cluster_m)});
  source.spec = {{"family", source.family},
                 {"kernel", gemm_kernel_name(spec.kernel)},
                 {"block_m", kGemmSm90BlockM},
                 {"block_n", spec.sm90.block_n},
                 {"block_k", kGemmSm90BlockK},
                 {"stages", spec.sm90.stages},
                 {"code_stages", spec.sm90.code_stages},
                 {"segments", spec.segments},
                 {"has_bias", spec.has_bias},
                 {"weights", weights_spec(spec.weights)},
                 {"dynamic_shared_bytes", spec.dynamic_shared_bytes()}};
  if (spec.sm90.cluster_m != 1) source.spec["cluster_m"] = spec.sm90.cluster_m;
  return source;
}

// Of `candidates` (widest first) whose block_n the segment widths allow, the least gemm_sm90_cost for
// [m_hint, n] on `arch`'s SMs; the earlier, wider one on a tie (fewer tile ends). None when no width fits.
std::optional<GemmSm90Tiling> least_cost_tiling(std::span<const GemmSm90Tiling> candidates, config::Arch arch,
                                                int m_hint, int n, std::span<const int> segment_widths) {
  std::optional<GemmSm90Tiling> best;
  double best_cost = 0;
  const int sms = typical_sm_count(arch);
  for (const GemmSm90Tiling& tiling : candidates) {
    if (!gemm_sm90_segments_fit(segment_widths, tiling.block_n)) continue;
    const double cost = gemm_sm90_cost(m_hint, n, tiling, sms);
    if (best && cost >= best_cost) continue;
    best = tiling;
    best_cost = cost;
  }
  return best;
}

}  // namespace

bool is_awq(const config::WeightEncoding& encoding) {
  return encoding.format == WeightFormat::packed_integer &&
         encoding.scheme == config::PackedIntegerScheme::awq;
}

std::string_view gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::wgmma:
      return "wgmma";
    case GemmKernel::wgmma_w4:
      return "wgmma_w4";
    case GemmKernel::wgmma_decode:
      return "wgmma_decode";
    default:
      return "mma_sync";
  }
}

GemmKernelChoice choose_gemm_kernel(config::Arch arch, int m_hint, int n, int k,
                                    std::span<const int> segment_widths) {
  if (arch.sm() != 90 || !arch.arch_specific) return {};  // wgmma exists only in sm_90a
  if (n <= 0 || k <= 0 || segment_widths.empty()) return {};
  // As many slots as fit beside the staging boxes: 192 takes 4 (5 would need 233 KiB), 160 5.
  constexpr GemmSm90Tiling kTilings[] = {{.block_n = 256, .stages = 4},
                                         {.block_n = 192, .stages = 4},
                                         {.block_n = 160, .stages = 5},
                                         {.block_n = 128, .stages = 6}};
  const std::optional<GemmSm90Tiling> tiling = least_cost_tiling(kTilings, arch, m_hint, n, segment_widths);
  if (!tiling) return {};
  return {GemmKernel::wgmma, *tiling};
}

bool gemm_sm90_segments_fit(std::span<const int> segment_widths, int block_n) {
  return segments_fit(segment_widths, wgmma_segment_multiple(block_n));
}

double gemm_sm90_cost(int m, int n, const GemmSm90Tiling& tiling, int sms) {
  // Narrower tiles re-read A per tile and spend a larger share on their epilogue (and a 160-wide one
  // stores 32 of its columns twice): per column the speed test puts 128- and 192-wide tiles at ~1.05-1.12x
  // a 256-wide one's time, 160-wide ones at ~1.10-1.17x (kernels-notes.md, "Session 15").
  // The decoding kernel's 64-wide tiles (short launches) pay that more, and each slice's fixed costs over
  // half the columns: Llama o at 256 tokens took 0.84x the time of 128-wide tiles in twice as many CTAs,
  // ~1.8 per column (kernels-notes.md, "Session 20").
  const double per_column = tiling.block_n == 256   ? 1.0
                            : tiling.block_n == 160 ? 1.15
                            : tiling.block_n == 64  ? 1.8
                                                    : 1.1;
  const std::int64_t row_tiles = ceil_div(std::max(m, 1), kGemmSm90BlockM);
  const std::int64_t tiles = row_tiles * ceil_div(std::max(n, 1), tiling.block_n);
  return double(ceil_div(tiles, std::int64_t{std::max(sms, 1)})) * tiling.block_n * per_column;
}

GemmVariantChoice choose_gemm_variant(int m, int n, const GemmSm90Tiling& planned,
                                      const GemmSm90Tiling& small, int multiprocessors) {
  const int sms = multiprocessors > 0 ? multiprocessors : typical_sm_count(config::Arch{9, 0, true});
  GemmVariantChoice choice;
  choice.planned_cost = gemm_sm90_cost(m, n, planned, sms);
  choice.small_cost = gemm_sm90_cost(m, n, small, sms);
  choice.small = choice.small_cost < choice.planned_cost;
  return choice;
}

bool sm90_w4_gemm_enabled() {
  return true;
}

bool sm90_w4_gemm_supports(const config::WeightEncoding& encoding) {
  switch (encoding.format) {
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4:
      return true;
    case WeightFormat::affine:
      return encoding.bits == 4 &&
             (encoding.group_size == 32 || encoding.group_size == 64 || encoding.group_size == 128);
    case WeightFormat::packed_integer:
      // GPTQ's [K / 8, N] words or AWQ's [K, N / 8]. A group must hold whole k16 steps and tile the
      // 64-wide K slot (or a whole number of them).
      return encoding.bits == 4 && !encoding.act_order &&
             (encoding.group_size == -1 ||
              (encoding.group_size > 0 && encoding.group_size % 16 == 0 &&
               (64 % encoding.group_size == 0 || encoding.group_size % 64 == 0)));
    case WeightFormat::fp8:  // weight-only: fp8 activations take gemm_sm90_fp8.cuh
      return encoding.activation == config::ActivationType::bf16;
    case WeightFormat::mxfp8:
      return true;
    default:
      return false;
  }
}

GemmKernelChoice choose_w4_gemm_kernel(const config::WeightEncoding& encoding, config::Arch arch, int m_hint,
                                       int n, int k, std::span<const int> segment_widths) {
  GemmKernelChoice choice;
  if (!sm90_w4_gemm_enabled() || !sm90_w4_gemm_supports(encoding)) return choice;
  const int bits = weight_bits(encoding);
  if (!std::all_of(segment_widths.begin(), segment_widths.end(),
                   [&](int width) { return sm90_w4_width_fits(encoding, width); }))
    return choice;
  if (arch.sm() != 90 || !arch.arch_specific) return choice;  // wgmma exists only in sm_90a
  if (n <= 0 || k <= 0 || k % (128 / bits) != 0 || segment_widths.empty()) return choice;
  if (!segments_fit(segment_widths, kGemmSm90W4BlockRows)) return choice;
  // Beside the epilogue's 32 KiB of staging boxes: five 36 KiB slots of 4-bit codes at 256 tokens, four
  // 40 KiB slots of 8-bit codes.
  const GemmSm90Tiling kWide{.block_n = 256, .stages = bits == 8 ? 4 : 5};
  constexpr GemmSm90Tiling kNarrow{.block_n = 128, .stages = 8};
  // Busiest SM's rounds of tiles times a tile's time (proportional to its tokens; a 128-token tile does
  // ~10% less per token: the weight slice is decoded once per tile, so twice as often per token).
  const std::int64_t sms = typical_sm_count(arch);
  const std::int64_t row_tiles = ceil_div(n, kGemmSm90W4BlockRows);
  auto cost = [&](const GemmSm90Tiling& t, double per_token) {
    return double(ceil_div(ceil_div(std::max(m_hint, 1), t.block_n) * row_tiles, sms)) * t.block_n *
           per_token;
  };
  choice.kernel = GemmKernel::wgmma_w4;
  choice.sm90 = cost(kWide, 1.0) <= cost(kNarrow, 1.1) ? kWide : kNarrow;
  return choice;
}

bool sm90_decode_gemm_supports(const config::WeightEncoding& encoding) {
  switch (encoding.format) {
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4:
    case WeightFormat::mxfp8:
      return true;
    case WeightFormat::affine:
      return encoding.bits == 4 &&
             (encoding.group_size == 32 || encoding.group_size == 64 || encoding.group_size == 128);
    case WeightFormat::fp8:  // weight-only: fp8 activations take gemm_sm90_fp8.cuh
      return encoding.activation == config::ActivationType::bf16;
    case WeightFormat::packed_integer:
      if (encoding.bits != 4) return false;
      // AWQ's words: groups of whole 64-k slices (the quarter warp of a word column shares one row scale
      // per lane).
      if (is_awq(encoding)) return encoding.group_size < 0 || encoding.group_size % 64 == 0;
      // GPTQ's words without act order: a unit (32 k of a row) in one group, with one zero point.
      return !encoding.act_order && (encoding.group_size < 0 || encoding.group_size % 32 == 0);
    default:
      return false;
  }
}

bool sm90_decode_awq_share_fits(int block_n, int cluster_m) {
  return cluster_m > 0 && block_n % cluster_m == 0 && (block_n / cluster_m) % 32 == 0;
}

bool sm90_decode_gemm_planned(const config::WeightEncoding& encoding) {
  return sm90_decode_gemm_supports(encoding) && weight_bits(encoding) == 4;
}

GemmSm90Tiling gemm_sm90_decode_tiling(int block_n, int bits, int cluster_m) {
  constexpr int kSharedLimit = 227 * 1024;
  // Four ring slots, which four decoder teams divide (six fit at 128 x2, for two teams only), then two.
  for (const int stages : {4, 2}) {
    for (const int code_stages : {4, 2}) {
      if (gemm_sm90_decode_dynamic_shared_bytes(block_n, cluster_m, stages, code_stages, bits) <=
          kSharedLimit)
        return {.block_n = block_n, .stages = stages, .cluster_m = cluster_m, .code_stages = code_stages};
    }
  }
  // No tiling of ours gets here.
  return {.block_n = block_n, .stages = 2, .cluster_m = cluster_m, .code_stages = 2};
}

GemmKernelChoice choose_decode_gemm_kernel(const config::WeightEncoding& encoding, config::Arch arch,
                                           int m_hint, int n, int k, std::span<const int> segment_widths) {
  if (!sm90_decode_gemm_supports(encoding)) return {};
  const int bits = weight_bits(encoding);
  if (k <= 0 || k % (128 / bits) != 0) return {};  // 16-byte rows of codes (TMA strides)
  if (arch.sm() != 90 || !arch.arch_specific || n <= 0 || segment_widths.empty()) return {};
  // The bf16 kernel's cost model over the widths the decoders have registers for.
  // 64 puts more CTAs to work where one or two row tiles leave SMs idle (session 20: at 256 tokens a
  // 4096-wide o in 128-wide tiles held 64 of 132 SMs). 96 was measured too and is not offered: level with
  // 128 x2 at 256 tokens, behind 64 at one row tile.
  // AWQ: segments of whole 32-row pieces (N / 8 words a 16-byte TMA stride), and no 160: its pairs' shares
  // of 80 rows are no whole code boxes of words (sm90_decode_awq_share_fits).
  const bool awq = is_awq(encoding);
  if (!std::all_of(segment_widths.begin(), segment_widths.end(),
                   [&](int width) { return sm90_w4_width_fits(encoding, width); }))
    return {};
  std::vector<GemmSm90Tiling> candidates;
  for (const int block_n : {192, 160, 128, 64}) {
    if (!(awq && block_n == 160)) candidates.push_back(gemm_sm90_decode_tiling(block_n, bits));
  }
  std::optional<GemmSm90Tiling> tiling = least_cost_tiling(candidates, arch, m_hint, n, segment_widths);
  if (!tiling) return {};
  // Clusters of 2 along M wherever two row tiles can pair: each W slice is then decoded once per pair, not
  // once per tile (session 17: 1.2-1.5x the unclustered kernel of the same width on every row measured
  // both ways; clusters of 4 were slower than 2). Every width's half is a multiple of 16 rows.
  // The ring is then chosen again: code slots hold the CTA's share, so more of them may fit.
  // 64-wide tiles stay unclustered: they are chosen for launches of one or two row tiles, where their CTAs
  // already fill the SMs; at one row tile a cluster's second CTA only doubles the tensor work (session 20:
  // Llama o at 64 tokens 0.0352 ms unclustered, 0.0432 in pairs; at 256 level, 0.0381 against 0.0385).
  if (tiling->block_n >= 128 && ceil_div(m_hint, kGemmSm90BlockM) >= 2)
    tiling = gemm_sm90_decode_tiling(tiling->block_n, bits, 2);
  return {GemmKernel::wgmma_decode, *tiling};
}

GemmSm90Params make_gemm_sm90_w4_params(const GemmSpec& spec, const GemmParams& params) {
  GemmSm90Params sm90{};
  sm90.gemm = params;
  encode_tensor_map(sm90.a_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, params.a, params.k, params.m, params.lda,
                    kGemmSm90W4BlockK, spec.sm90.block_n, "gemm a");
  const bool awq = is_awq(spec.weights);
  const bool gptq = spec.weights.format == WeightFormat::packed_integer && !awq;
  const int row_bytes_per_k_slot = kGemmSm90W4BlockK * weight_bits(spec.weights) / 8;  // 32 or 64
  for (int s = 0; s < spec.segments; ++s) {
    const GemmSegment& segment = params.segments[s];
    const int rows = segment.n_end - segment.n_begin;
    const std::string field = fmt::format("gemm segments[{}].weight", s);
    if (gptq) {  // words [K / 8, rows]: boxes of 8 word rows (64 k) of 128 weight rows, unswizzled
      encode_tensor_map(sm90.w_maps[s], CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, segment.weight, rows, params.k / 8,
                        rows, kGemmSm90W4BlockRows, kGemmSm90W4BlockK / 8, field, CU_TENSOR_MAP_SWIZZLE_NONE);
    } else if (awq) {  // words [K, rows / 8]: boxes of 64 k of 16 words (128 weight rows), unswizzled
      encode_tensor_map(sm90.w_maps[s], CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, segment.weight, rows / 8, params.k,
                        rows / 8, kGemmSm90W4BlockRows / 8, kGemmSm90W4BlockK, field,
                        CU_TENSOR_MAP_SWIZZLE_NONE);
    } else {  // bytes [rows, K * bits / 8]: boxes of 64 k (32 or 64 bytes) of 128 rows, unswizzled
      const long long row_bytes = static_cast<long long>(params.k) * weight_bits(spec.weights) / 8;
      encode_tensor_map(sm90.w_maps[s], CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, segment.weight, row_bytes, rows,
                        row_bytes, row_bytes_per_k_slot, kGemmSm90W4BlockRows, field,
                        CU_TENSOR_MAP_SWIZZLE_NONE);
    }
  }
  encode_gemm_c_map(sm90.c_map, params);
  return sm90;
}

int typical_sm_count(config::Arch arch) {
  switch (arch.sm()) {
    case 80:
      return 108;
    case 86:
      return 84;
    case 89:
      return 128;
    case 90:
      return 132;
    default:
      return 132;
  }
}

GemmTiling choose_gemm_tiling(int m_hint, int n, int k, config::Arch arch) {
  const std::int64_t m = std::max(m_hint, 1);
  const std::int64_t columns = std::max(n, 1);
  const std::int64_t depth = std::max(k, 1);
  const std::int64_t sms = typical_sm_count(arch);

  const Candidate* best = nullptr;
  double best_us = 0;
  for (const Candidate& candidate : kCandidates) {
    const GemmTiling& t = candidate.tiling;
    const std::int64_t tiles = ceil_div(m, t.block_m) * ceil_div(columns, t.block_n);
    const std::int64_t k_tiles = ceil_div(depth, t.block_k);
    const std::int64_t resident = resident_ctas(candidate, arch);
    // The busiest SM gets ceil(tiles / SMs) tiles and runs them in rounds of up to `resident` CTAs; a
    // round lasts as long as the slower of one CTA's latency and the SM's throughput over all of them.
    const std::int64_t tiles_per_sm = ceil_div(tiles, sms);
    const double latency_us = double(k_tiles) * candidate.latency_per_k_tile_us;
    const double cta_us = double(t.block_m) * t.block_n * double(k_tiles * t.block_k) / candidate.macs_per_us;
    auto round_us = [&](std::int64_t ctas) { return std::max(latency_us, double(ctas) * cta_us); };
    const std::int64_t full_rounds = tiles_per_sm / resident;
    const std::int64_t last_round = tiles_per_sm % resident;
    const double estimate_us =
        double(full_rounds) * round_us(resident) + (last_round > 0 ? round_us(last_round) : 0);
    if (best == nullptr || estimate_us < best_us) {  // ties keep the earlier, larger tile
      best = &candidate;
      best_us = estimate_us;
    }
  }
  return best->tiling;
}

bool gemm_supports(const config::WeightEncoding& encoding) {
  switch (encoding.format) {
    case WeightFormat::bf16:
    case WeightFormat::mxfp8:
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4:
      return true;
    case WeightFormat::fp8:
      return encoding.activation == config::ActivationType::bf16;
    case WeightFormat::packed_integer: {
      // 8 consecutive k of a row share a group (the kernel dequantizes 8 at a time).
      const bool group =
          encoding.group_size == -1 || (encoding.group_size > 0 && encoding.group_size % 8 == 0);
      if (encoding.scheme == config::PackedIntegerScheme::awq)
        return encoding.bits == 4 && group && !encoding.act_order;
      return (encoding.bits == 4 || encoding.bits == 8) && group;
    }
    case WeightFormat::affine:
      return encoding.bits >= 2 && encoding.bits <= 8 && encoding.bits != 7 &&
             (encoding.group_size == 32 || encoding.group_size == 64 || encoding.group_size == 128);
    default:
      return false;
  }
}

compiler::KernelSource GemmSpec::source() const {
  if (!gemm_supports(weights)) {
    throw Error(Stage::input,
                fmt::format("gemm: no weight loader for format {}{}", config::to_string(weights.format),
                            weights.format == WeightFormat::fp8 ? " with fp8 activations" : ""));
  }
  if (kernel == GemmKernel::wgmma && weights.format != WeightFormat::bf16) {
    throw Error(Stage::input, fmt::format("gemm: the wgmma kernel reads bf16 weights only, not {}",
                                          config::to_string(weights.format)));
  }
  const bool decode_cluster = kernel == GemmKernel::wgmma_decode &&
                              (sm90.cluster_m == 2 || sm90.cluster_m == 4) &&
                              sm90.block_n % (16 * sm90.cluster_m) == 0;
  if (sm90.cluster_m != 1 && !decode_cluster && (kernel != GemmKernel::wgmma || sm90.cluster_m != 2)) {
    throw Error(
        Stage::input,
        fmt::format("gemm: cluster_m {} with the {} kernel and block_n {} (clusters of 2 are the bf16 "
                    "wgmma kernel's; the wgmma_decode kernel's are of 2 or 4, each CTA's share of "
                    "block_n a multiple of 16 rows)",
                    sm90.cluster_m, gemm_kernel_name(kernel), sm90.block_n));
  }
  if (kernel == GemmKernel::wgmma && sm90.cluster_m != 1 && (sm90.block_n / 2) % kGemmSm90WPieceRows != 0) {
    throw Error(Stage::input,
                fmt::format("gemm: block_n {} with clusters (a CTA's half, {} rows, is not whole 32-row W "
                            "pieces)",
                            sm90.block_n, sm90.block_n / 2));
  }
  if (postprocess && kernel != GemmKernel::wgmma) {
    throw Error(Stage::input, fmt::format("gemm: the q|k|v postprocess in the epilogue is the bf16 wgmma "
                                          "kernel's, not the {} kernel's",
                                          gemm_kernel_name(kernel)));
  }
  if (kernel == GemmKernel::wgmma_w4) return sm90_w4_source(*this);
  if (kernel == GemmKernel::wgmma_decode) return sm90_decode_source(*this);
  compiler::KernelSource source;
  if (kernel == GemmKernel::wgmma) {
    source.family = "gemm_sm90";
    source.header = "attnplan/gemm_sm90.cuh";
    source.traits = "attnplan::kernels::GemmSm90Traits";
    source.kernel = "attnplan::kernels::gemm_sm90_kernel";
    source.grid_constant = true;  // the tensor maps must stay in parameter memory
    source.arguments = {{"block_n", std::to_string(sm90.block_n)},
                        {"stages", std::to_string(sm90.stages)},
                        {"segments", std::to_string(segments)},
                        {"has_bias", cxx_bool(has_bias)}};
    source.spec = {{"family", source.family},
                   {"kernel", gemm_kernel_name(kernel)},
                   {"block_m", kGemmSm90BlockM},
                   {"block_n", sm90.block_n},
                   {"block_k", kGemmSm90BlockK},
                   {"stages", sm90.stages},
                   {"segments", segments},
                   {"has_bias", has_bias},
                   {"dynamic_shared_bytes", dynamic_shared_bytes()}};
    // Unclustered specializations keep their stub, and so their cache key, from before clusters existed.
    if (sm90.cluster_m != 1 || postprocess) {
      source.arguments.push_back({"cluster_m", std::to_string(sm90.cluster_m)});
      source.spec["cluster_m"] = sm90.cluster_m;
    }
    if (postprocess) {
      if (!postprocess->fits_gemm_epilogue(sm90.block_n)) {
        throw Error(
            Stage::input,
            fmt::format("gemm: the q|k|v postprocess does not fit the epilogue of {}-wide tiles (head "
                        "dim {}, pairing dim {}, rotary offset {})",
                        sm90.block_n, postprocess->head_dim, postprocess->pairing_dim,
                        postprocess->rotary_offset));
      }
      source.arguments.push_back({"qkv_epilogue", postprocess->epilogue_traits()});
      source.spec["qkv_epilogue"] = postprocess->epilogue_spec();
    }
    return source;
  }
  source.family = "gemm";
  source.header = "attnplan/gemm.cuh";
  source.traits = "attnplan::kernels::GemmTraits";
  source.kernel = "attnplan::kernels::gemm_kernel";
  source.arguments = {
      {"block_m", std::to_string(tiling.block_m)}, {"block_n", std::to_string(tiling.block_n)},
      {"block_k", std::to_string(tiling.block_k)}, {"warps_m", std::to_string(tiling.warps_m)},
      {"warps_n", std::to_string(tiling.warps_n)}, {"stages", std::to_string(tiling.stages)},
      {"segments", std::to_string(segments)},      {"has_bias", cxx_bool(has_bias)},
  };
  // bf16 keeps its instantiation (the policy's default) and so its cache key.
  if (weights.format != WeightFormat::bf16) source.arguments.push_back({"weights", weight_policy(weights)});
  source.spec = {{"family", source.family},   {"block_m", tiling.block_m},
                 {"block_n", tiling.block_n}, {"block_k", tiling.block_k},
                 {"warps_m", tiling.warps_m}, {"warps_n", tiling.warps_n},
                 {"stages", tiling.stages},   {"segments", segments},
                 {"has_bias", has_bias},      {"dynamic_shared_bytes", dynamic_shared_bytes()}};
  if (weights.format != WeightFormat::bf16) {
    source.spec["weights"] = {{"format", config::to_string(weights.format)},
                              {"scale_granularity", config::to_string(weights.scale_granularity)}};
    if (word_copied(weights)) {
      source.spec["weights"]["bits"] = weights.bits;
      source.spec["weights"]["group_size"] = weights.group_size;
      if (weights.format == WeightFormat::packed_integer) {
        source.spec["weights"]["scheme"] = config::to_string(weights.scheme);
        source.spec["weights"]["act_order"] = weights.act_order;
      }
    }
  }
  return source;
}

int GemmSpec::threads() const {
  // wgmma kernels: producer + 2 consumer warpgroups; wgmma_decode: 2 decoder warpgroups (the first one's
  // thread 0 produces) + 2 consumer warpgroups.
  if (kernel == GemmKernel::wgmma_decode) return 4 * 128;
  return kernel == GemmKernel::mma_sync ? tiling.threads() : 3 * 128;
}

int GemmSpec::dynamic_shared_bytes() const {
  if (kernel == GemmKernel::wgmma) return gemm_sm90_dynamic_shared_bytes(sm90.block_n, sm90.stages);
  if (kernel == GemmKernel::wgmma_w4)
    return gemm_sm90_w4_dynamic_shared_bytes(sm90.block_n, sm90.stages, weight_bits(weights));
  if (kernel == GemmKernel::wgmma_decode)
    return gemm_sm90_decode_dynamic_shared_bytes(sm90.block_n, sm90.cluster_m, sm90.stages, sm90.code_stages,
                                                 weight_bits(weights));
  return gemm_dynamic_shared_bytes(tiling.block_m, tiling.block_n, tiling.block_k, tiling.stages,
                                   weight_bits(weights));
}

driver::LaunchShape GemmSpec::launch_shape(int m, int n, int multiprocessors) const {
  const bool wgmma = kernel != GemmKernel::mma_sync;
  // wgmma_w4 tiles are [block_n tokens, 128 weight rows]; wgmma_decode's are the bf16 kernel's.
  const bool bf16_tiles = kernel == GemmKernel::wgmma || kernel == GemmKernel::wgmma_decode;
  const int block_m = bf16_tiles ? kGemmSm90BlockM : wgmma ? sm90.block_n : tiling.block_m;
  const int block_n = bf16_tiles ? sm90.block_n : wgmma ? kGemmSm90W4BlockRows : tiling.block_n;
  // Clusters (the bf16 wgmma and wgmma_decode kernels) take tiles in columns of cluster_m (the last one
  // padded).
  const int cluster = bf16_tiles ? sm90.cluster_m : 1;
  std::int64_t tiles = ceil_div(m, block_m * cluster) * cluster * ceil_div(n, block_n);
  if (m <= 0 || n <= 0 || tiles > 0x7fffffff) {
    throw Error(Stage::input, fmt::format("gemm: no launch shape for M = {}, N = {}", m, n));
  }
  if (wgmma) {
    // Persistent: one CTA per SM walks the tiles, whole clusters only. Hopper's GPCs are made of
    // two-SM TPCs, so clusters of 2 fill every SM.
    const int sms = multiprocessors > 0 ? multiprocessors : typical_sm_count({9, 0, true});
    tiles = std::min<std::int64_t>(tiles, std::max(sms / cluster, 1) * cluster);
  }
  return driver::LaunchShape{{static_cast<unsigned>(tiles), 1, 1},
                             {static_cast<unsigned>(threads()), 1, 1},
                             static_cast<unsigned>(dynamic_shared_bytes()),
                             {static_cast<unsigned>(cluster), 1, 1}};
}

void GemmSpec::check(const GemmParams& params) const {
  // Sizes, strides, A, C, the segments' order, weights and biases (gemm_common.hpp), then this spec's
  // formats and kernel.
  const bool f32_scales = weights.format == WeightFormat::fp8 || word_copied(weights);
  const auto segment_rules = [&](int s, const GemmSegment& segment) {
    if (weights.format != WeightFormat::bf16) {
      require(segment.scales != nullptr && (!f32_scales || aligned(segment.scales, 4)),
              fmt::format("segments[{}].scales: null{} ({} weights)", s,
                          f32_scales ? " or not 4-byte aligned" : "", config::to_string(weights.format)));
      require(weights.format != WeightFormat::nvfp4 || segment.scale_2 != nullptr,
              fmt::format("segments[{}].scale_2: null (nvfp4 weights)", s));
    }
    if (word_copied(weights)) {
      const char* zeros = weights.format == WeightFormat::affine ? "biases" : "qzeros";
      require(segment.zeros != nullptr && aligned(segment.zeros, 4),
              fmt::format("segments[{}].zeros ({}): null or not 4-byte aligned", s, zeros));
      require(!weights.act_order || weights.format != WeightFormat::packed_integer ||
                  (segment.g_idx != nullptr && aligned(segment.g_idx, 4)),
              fmt::format("segments[{}].g_idx: null or not 4-byte aligned (act_order)", s));
      // A copied word holds 32 / bits columns (GPTQ / AWQ zeros, AWQ weights) of one segment.
      const int width = segment.n_end - segment.n_begin;
      require(weights.format != WeightFormat::packed_integer || width % 8 == 0,
              fmt::format("segments[{}] is {} wide, not a multiple of 8 ({} packs columns in words)", s,
                          width, config::to_string(weights.scheme)));
    }
  };
  if (!check_gemm_operands(params, segments, has_bias, "gemm", segment_rules)) return;
  require(params.k % 8 == 0, fmt::format("K = {} is not a multiple of 8", params.k));
  if (weights.format == WeightFormat::packed_integer) {
    const int per_word = 32 / weights.bits;
    require(weights.group_size <= 0 || params.k % weights.group_size == 0,
            fmt::format("K = {} is not a multiple of group_size {}", params.k, weights.group_size));
    require(params.k % per_word == 0, fmt::format("K = {} is not a multiple of {} ({}-bit qweight words)",
                                                  params.k, per_word, weights.bits));
  } else if (weights.format == WeightFormat::affine) {
    require(params.k % weights.group_size == 0,
            fmt::format("K = {} is not a multiple of group_size {}", params.k, weights.group_size));
  } else if (const int bits = weight_bits(weights); bits < 16) {
    const int per_chunk = 128 / bits;  // values of one 16-byte packed chunk
    require(params.k % per_chunk == 0,
            fmt::format("K = {} is not a multiple of {} ({} weights copy 16-byte chunks)", params.k,
                        per_chunk, config::to_string(weights.format)));
  }
  if (kernel != GemmKernel::mma_sync) {
    require(params.k > 0, "K = 0: the wgmma kernel needs K > 0 (TMA dimensions are positive)");
    // Every segment but the last a whole number of tiles (wgmma_w4's always span 128 weight rows), or of
    // 32-row W pieces for the wgmma tiles that straddle segments (160, 192).
    const bool bf16_tiles = kernel == GemmKernel::wgmma || kernel == GemmKernel::wgmma_decode;
    const bool straddles = bf16_tiles && gemm_sm90_tiles_straddle(sm90.block_n);
    const int multiple = bf16_tiles ? wgmma_segment_multiple(sm90.block_n) : kGemmSm90W4BlockRows;
    for (int s = 0; s + 1 < segments; ++s) {
      const int width = params.segments[s].n_end - params.segments[s].n_begin;
      require(width % multiple == 0,
              straddles
                  ? fmt::format("segments[{}] is {} wide, not a multiple of the wgmma kernel's {}-row W "
                                "pieces (a piece would straddle two segments)",
                                s, width, multiple)
                  : fmt::format("segments[{}] is {} wide, not a multiple of the {} kernel's {} weight rows "
                                "per tile (a tile would straddle two segments)",
                                s, width, gemm_kernel_name(kernel), multiple));
    }
  }
  if (kernel == GemmKernel::wgmma_w4 || kernel == GemmKernel::wgmma_decode) {
    for (int s = 0; s < segments; ++s) {
      const int width = params.segments[s].n_end - params.segments[s].n_begin;
      require(sm90_w4_width_fits(weights, width),
              fmt::format("segments[{}] is {} wide, not a multiple of 32 (the {} kernel reads AWQ's rows "
                          "of N / 8 words as 16-byte TMA strides)",
                          s, width, gemm_kernel_name(kernel)));
    }
  }
  if (kernel == GemmKernel::wgmma_w4 || kernel == GemmKernel::wgmma_decode) {
    // Both load the codes by TMA, whose global rows are whole 16-byte strides.
    const int bits = weight_bits(weights);
    require(params.k % (128 / bits) == 0,
            fmt::format("K = {} is not a multiple of {} (the {} kernel's 16-byte rows of {}-bit codes)",
                        params.k, 128 / bits, gemm_kernel_name(kernel), bits));
  }
}

GemmQkvEpilogueParams checked_qkv_epilogue(const QkvPostprocessSpec& post,
                                           const GemmQkvEpilogueParams* qkv_epilogue) {
  if (qkv_epilogue == nullptr)
    throw Error(Stage::input, "gemm qkv_epilogue: the spec fuses the q|k|v postprocess; pass its values");
  if (post.rotary_dim > 0 && qkv_epilogue->rotations == nullptr)
    throw Error(Stage::input, "gemm qkv_epilogue.rotations: null, but the epilogue applies RoPE");
  if (post.rotary_dim > 0 && qkv_epilogue->rotation_stride != rope_rotation_stride(post.rotary_dim)) {
    throw Error(Stage::input, fmt::format("gemm qkv_epilogue.rotation_stride: {} is not {} (rotary dim {})",
                                          qkv_epilogue->rotation_stride,
                                          rope_rotation_stride(post.rotary_dim), post.rotary_dim));
  }
  if (post.query_norm && qkv_epilogue->q_norm_weight == nullptr)
    throw Error(Stage::input, "gemm qkv_epilogue.q_norm_weight: null, but the epilogue normalizes q");
  if (post.key_norm && qkv_epilogue->k_norm_weight == nullptr)
    throw Error(Stage::input, "gemm qkv_epilogue.k_norm_weight: null, but the epilogue normalizes k");
  return *qkv_epilogue;
}

GemmSm90Params make_gemm_sm90_params(const GemmSpec& spec, const GemmParams& params,
                                     const GemmQkvEpilogueParams* qkv_epilogue) {
  GemmSm90Params sm90{};
  sm90.gemm = params;
  if (spec.postprocess) sm90.qkv_epilogue = checked_qkv_epilogue(*spec.postprocess, qkv_epilogue);
  encode_tensor_map(sm90.a_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, params.a, params.k, params.m, params.lda,
                    kGemmSm90BlockK, kGemmSm90BlockM, "gemm a");
  for (int s = 0; s < spec.segments; ++s) {
    const GemmSegment& segment = params.segments[s];
    // Each CTA of a cluster loads its share of the W slice (gemm_sm90.cuh).
    encode_tensor_map(sm90.w_maps[s], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, segment.weight, params.k,
                      segment.n_end - segment.n_begin, params.k, kGemmSm90BlockK,
                      gemm_sm90_w_box_rows(spec.sm90.block_n, spec.sm90.cluster_m, spec.segments),
                      fmt::format("gemm segments[{}].weight", s));
  }
  encode_gemm_c_map(sm90.c_map, params);
  return sm90;
}

GemmSm90Params make_gemm_sm90_decode_params(const GemmSpec& spec, const GemmParams& params) {
  GemmSm90Params sm90{};
  sm90.gemm = params;
  encode_tensor_map(sm90.a_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, params.a, params.k, params.m, params.lda,
                    kGemmSm90BlockK, kGemmSm90BlockM, "gemm a");
  const int bits = weight_bits(spec.weights);
  const long long row_bytes = static_cast<long long>(params.k) * bits / 8;
  const int box_rows = gemm_sm90_decode_code_box_rows(spec.sm90.block_n, spec.sm90.cluster_m, spec.segments);
  for (int s = 0; s < spec.segments; ++s) {
    const GemmSegment& segment = params.segments[s];
    const int rows = segment.n_end - segment.n_begin;
    if (is_awq(spec.weights)) {  // words [K, rows / 8]: boxes of 64 k of a share's (or piece's) words
      encode_tensor_map(sm90.w_maps[s], CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, segment.weight, rows / 8, params.k,
                        rows / 8, box_rows / 8, kGemmSm90BlockK, fmt::format("gemm segments[{}].weight", s),
                        CU_TENSOR_MAP_SWIZZLE_NONE);
      continue;
    }
    if (spec.weights.format == WeightFormat::packed_integer) {  // GPTQ's words [K / 8, rows]: boxes of 8
      // word rows (64 k) of a share's (or piece's) rows
      encode_tensor_map(sm90.w_maps[s], CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, segment.weight, rows, params.k / 8,
                        rows, box_rows, kGemmSm90BlockK / 8, fmt::format("gemm segments[{}].weight", s),
                        CU_TENSOR_MAP_SWIZZLE_NONE);
      continue;
    }
    // Bytes [rows, K * bits / 8]: boxes of 64 k (32 or 64 bytes) of a CTA's share of a tile's rows, or
    // of pieces where tiles straddle segments, unswizzled.
    encode_tensor_map(sm90.w_maps[s], CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, segment.weight, row_bytes, rows,
                      row_bytes, kGemmSm90BlockK * bits / 8, box_rows,
                      fmt::format("gemm segments[{}].weight", s), CU_TENSOR_MAP_SWIZZLE_NONE);
  }
  encode_gemm_c_map(sm90.c_map, params);
  return sm90;
}

void launch_gemm(const driver::Function& function, const GemmSpec& spec, const GemmParams& params,
                 CUstream stream, int multiprocessors, const GemmQkvEpilogueParams* qkv_epilogue) {
  if (params.m == 0 || params.n == 0) return;
  const driver::LaunchShape shape = spec.launch_shape(params.m, params.n, multiprocessors);
  if (spec.kernel == GemmKernel::wgmma) {
    driver::launch(function, shape, stream, make_gemm_sm90_params(spec, params, qkv_epilogue));
  } else if (spec.kernel == GemmKernel::wgmma_w4) {
    driver::launch(function, shape, stream, make_gemm_sm90_w4_params(spec, params));
  } else if (spec.kernel == GemmKernel::wgmma_decode) {
    driver::launch(function, shape, stream, make_gemm_sm90_decode_params(spec, params));
  } else {
    driver::launch(function, shape, stream, params);
  }
}

compiler::KernelSource DequantizeSpec::source() const {
  if (weights.format == WeightFormat::bf16 || !gemm_supports(weights)) {
    throw Error(Stage::input,
                fmt::format("dequantize: no weight loader for format {}{}", config::to_string(weights.format),
                            weights.format == WeightFormat::fp8 ? " with fp8 activations" : ""));
  }
  compiler::KernelSource source;
  source.family = "dequantize";
  source.header = "attnplan/dequantize.cuh";
  const bool table = kernel == DequantizeKernel::group_table;
  if (table && (!gathers_groups(weights) || groups < 1 || groups > kDequantizeTableMaxGroups)) {
    throw Error(Stage::input, fmt::format("dequantize: no group table of {} groups for format {}{}", groups,
                                          config::to_string(weights.format), packed_integer_detail(weights)));
  }
  source.traits = table ? "attnplan::kernels::DequantizeTableTraits" : "attnplan::kernels::DequantizeTraits";
  source.kernel =
      table ? "attnplan::kernels::dequantize_table_kernel" : "attnplan::kernels::dequantize_kernel";
  source.arguments = {{"segments", std::to_string(segments)}, {"weights", weight_policy(weights)}};
  if (table) source.arguments.push_back({"groups", std::to_string(groups)});
  source.spec = {{"family", source.family},
                 {"block_rows", table ? kDequantizeTableBlockRows : kDequantizeBlockRows},
                 {"block_k", table ? kDequantizeTableBlockK : kDequantizeBlockK},
                 {"segments", segments},
                 {"weights", weights_spec(weights)}};
  if (table) source.spec["groups"] = groups;
  return source;
}

driver::LaunchShape DequantizeSpec::launch_shape(int n, int k) const {
  if (n <= 0 || k <= 0)
    throw Error(Stage::input, fmt::format("dequantize: no launch shape for N = {}, K = {}", n, k));
  const bool table = kernel == DequantizeKernel::group_table;
  const int block_rows = table ? kDequantizeTableBlockRows : kDequantizeBlockRows;
  const int block_k = table ? kDequantizeTableBlockK : kDequantizeBlockK;
  return driver::LaunchShape{
      {static_cast<unsigned>(ceil_div(n, block_rows)), static_cast<unsigned>(ceil_div(k, block_k)), 1},
      {static_cast<unsigned>(kDequantizeThreads), 1, 1},
      static_cast<unsigned>(dynamic_shared_bytes())};
}

int DequantizeSpec::dynamic_shared_bytes() const {
  return kernel == DequantizeKernel::group_table ? dequantize_table_shared_bytes(groups, weights.bits) : 0;
}

void DequantizeSpec::check(const DequantizeParams& params) const {
  GemmSpec quantized;
  quantized.segments = segments;
  quantized.weights = weights;
  quantized.has_bias = true;  // the biases belong to the GEMM that follows; any pointer is accepted here
  quantized.check(params.gemm);
  require(params.weight != nullptr && aligned(params.weight, 16),
          "dequantize weight: null or not 16-byte aligned (W [N, K] bf16 in the workspace)");
  if (kernel != DequantizeKernel::group_table) return;
  require(group_count(weights, params.gemm.k) == groups,
          fmt::format("dequantize: K = {} has {} groups of {}, the group table was compiled for {}",
                      params.gemm.k, group_count(weights, params.gemm.k), weights.group_size, groups));
  for (int s = 1; s < segments; ++s) {
    require(params.gemm.segments[s].n_begin % kDequantizeTableBlockRows == 0,
            fmt::format("dequantize: segments[{}] begins at row {}, not a multiple of {} (the group table's "
                        "CTAs take one segment's rows)",
                        s, params.gemm.segments[s].n_begin, kDequantizeTableBlockRows));
  }
}

DequantizeSpec choose_dequantize(int segments, const config::WeightEncoding& weights, int k,
                                 std::span<const int> segment_widths) {
  DequantizeSpec spec{segments, weights};
  const int groups = group_count(weights, k);
  if (gathers_groups(weights) && groups <= kDequantizeTableMaxGroups &&
      segments_fit(segment_widths, kDequantizeTableBlockRows)) {
    spec.kernel = DequantizeKernel::group_table;
    spec.groups = groups;
  }
  return spec;
}

int dequantized_min_tokens(const config::WeightEncoding& weights) {
  if (!sm90_w4_gemm_supports(weights)) return 1;  // mma.sync: behind the path at every length
  const bool slow_short_kernel =
      weights.format == WeightFormat::nvfp4 || weights.format == WeightFormat::mxfp4 || is_awq(weights);
  return slow_short_kernel ? 512 : 1024;
}

int decode_dequantized_min_tokens(const GemmSm90Tiling& decode, int n, int sms) {
  // Clusters launch whole clusters of row tiles (GemmSpec::launch_shape), so a wave holds whole clusters.
  const std::int64_t cluster = std::max(decode.cluster_m, 1);
  const std::int64_t column_tiles = ceil_div(std::int64_t{std::max(n, 1)}, std::int64_t{decode.block_n});
  const std::int64_t one_wave_rows = std::max(sms, 0) / (column_tiles * cluster) * cluster * kGemmSm90BlockM;
  return static_cast<int>(std::clamp<std::int64_t>(one_wave_rows + 1, 512, 1024));
}

int dequantized_min_tokens(const GemmSpec& quantized, config::Arch arch, int n) {
  if (quantized.kernel == GemmKernel::wgmma_decode)
    return decode_dequantized_min_tokens(quantized.sm90, n, typical_sm_count(arch));
  return dequantized_min_tokens(quantized.weights);
}

std::optional<GemmSpec> choose_dequantized_gemm(const GemmSpec& quantized, config::Arch arch, int m_hint,
                                                int n, int k, std::span<const int> segment_widths) {
  const config::WeightEncoding& weights = quantized.weights;
  if (weights.format == WeightFormat::bf16 || !gemm_supports(weights)) return std::nullopt;
  if (m_hint < dequantized_min_tokens(quantized, arch, n)) return std::nullopt;
  const GemmKernelChoice choice = choose_gemm_kernel(arch, m_hint, n, k, segment_widths);
  if (choice.kernel != GemmKernel::wgmma) return std::nullopt;  // sm_90a and tileable segments only
  GemmSpec gemm;
  gemm.segments = quantized.segments;
  gemm.has_bias = quantized.has_bias;
  gemm.kernel = GemmKernel::wgmma;
  gemm.sm90 = choice.sm90;
  gemm.tiling = choose_gemm_tiling(m_hint, n, k, arch);
  return gemm;
}

GemmParams dequantized_gemm_params(const GemmParams& quantized, const bf16_bits* weight) {
  GemmParams params = quantized;
  for (GemmSegment& segment : params.segments) {
    segment.weight = weight + static_cast<long long>(segment.n_begin) * quantized.k;
    segment.scales = nullptr;
    segment.scale_2 = nullptr;
    segment.zeros = nullptr;
    segment.g_idx = nullptr;
  }
  return params;
}

void launch_dequantize(const driver::Function& function, const DequantizeSpec& spec,
                       const DequantizeParams& params, CUstream stream) {
  if (params.gemm.n == 0 || params.gemm.k == 0) return;
  driver::launch(function, spec.launch_shape(params.gemm.n, params.gemm.k), stream, params);
}

}  // namespace attnplan::plan
