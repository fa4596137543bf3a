// The sm_90a decoding projection GEMM: C[M, N] = A[M, K] · dequant(W)[N, K]^T (+ bias[N]) for weights whose
// codes are rows of bytes [N, K * bits / 8] in k order: 4-bit mxfp4, nvfp4 and MLX affine (two codes per
// byte, low nibble first), 8-bit e4m3fn (fp8 weight-only, mxfp8); and for AWQ's words [K, N / 8] and GPTQ's
// [K / 8, N] (4 bits, no act order); bf16 activations, fp32 accumulation, one rounding of each weight to
// bf16 and one of each output — the semantics of gemm.cuh and gemm_sm90_w4.cuh.
//
// It is gemm_sm90.cuh with another producer. Short launches of a 4-bit projection are compute-bound, like
// bf16 ones: the mixed-input kernel (gemm_sm90_w4.cuh) loses there because its consumers decode between
// their wgmmas, and the dequantized path (dequantize.cuh, then the bf16 GEMM) because it writes and reads
// W as bf16 once per launch. Here warpgroups 0 and 1 decode instead of only streaming: thread 0 first
// issues the TMA loads of the first `code_stages` slices' codes into a ring of code slots, and the decoder
// warps, in 1, 2 or 4 teams that take the slices in turn (decoder_teams), turn each code slice into the
// bf16 W slice [block_n, 64], 128-byte swizzled exactly as TMA writes it, in the ring slot beside A (whose
// TMA load one warp of the team issues when the slot is free). A team needs no barrier of its own: each of
// its warps arrives on the slot's "full" barrier after its writes and a proxy fence (wgmma reads through
// the async proxy), and the last of its warps to read a code slot (a count in shared memory) reloads it,
// code_stages slices ahead. Warpgroups 2 and 3 consume.
// The consumers are the bf16 kernel's (consume_tiles): they read W from shared memory as if TMA had loaded
// it, and free each slot as soon as its wgmmas complete (release_each_slot). Each slot's "full" barrier
// completes with the A bytes and one arrival per warp of the decoding team.
//
// Clusters of 2 or 4 CTAs along M (vertically adjacent tiles share every W slice): each CTA decodes only
// its share, block_n / cluster_m rows, and the last team warp to write its rows has the bulk-copy engine
// take the share to the same place in the other CTAs' slots, where the copies complete on those CTAs' full
// barriers (their expected bytes: A and the others' shares). The consumers release a slot to every CTA of
// the cluster, so it is free everywhere before anyone writes or copies into it. Without clusters every
// tile decodes the whole slice (4 times per slice at 512 tokens).
//
// Team thread t decodes units of 16 code bytes (32 k of 4-bit codes, 16 of 8-bit ones): unit t % 2 (t % 4)
// of rows t / 2 (t / 4) + rows_per_pass i of its share. A warp's 16-byte code loads read 512 contiguous
// bytes, conflict-free, and each of its 16-byte stores puts 8 distinct swizzled chunks in every 8 lanes, 4
// wavefronts. A unit has one group scale (two for nvfp4; the scales come through L1, a slice ahead). Rows
// past N and k past K are written as zeros (their codes are TMA's zero fill; their scales are not read).
//
// Tails and segments as gemm_sm90.cuh: any M and N, K a multiple of 128 / bits (16-byte code rows, a TMA
// requirement), every segment but the last a multiple of block_n (128) or of 32 (64, 96, 160, 192: codes
// come in 32- or 16-row pieces, each from its own segment's map).
//
// Compiles for every target; its body exists only for sm_90a (ATTNPLAN_SM90A_ENABLED) and traps elsewhere.
#pragma once

#include "attnplan/gemm.cuh"
#include "attnplan/gemm_sm90.cuh"
#include "attnplan/gemm_sm90_decode_params.h"
#include "attnplan/wgmma.cuh"

namespace attnplan::kernels {

// Decoder teams (see GemmSm90DecodeTraits::decoder_teams) for a ring of `stages` slots, `code_stages` code
// slots and shares of `share_rows` W rows, a thread taking at most `max_passes` units a slice, all decoder
// threads together covering `decoder_rows_per_pass` rows a pass.
constexpr int gemm_sm90_decoder_teams(int stages, int code_stages, int share_rows, int max_passes,
                                      int decoder_rows_per_pass) {
  for (int teams = 4; teams > 1; teams /= 2) {
    const int rows_per_pass = decoder_rows_per_pass / teams;
    if (stages % teams == 0 && code_stages % teams == 0 && share_rows <= max_passes * rows_per_pass)
      return teams;
  }
  return 1;
}

// kFormat: a row-byte policy of gemm.cuh with code_pair and group_scale (group_offset where has_offset):
// Mxfp4Weights, Nvfp4Weights, AffineWeights<4, group>, Fp8Weights<granularity> or Mxfp8Weights; or a
// word policy: AwqWeights<group> (n_major_words) or GptqWeights<4, v2, group, false> (k_major_words).
// kClusterM: CTAs per cluster along M (1, 2 or 4); each decodes its share of every W slice and copies it
// into the others' slots.
template <int kBlockN, int kStages, int kCodeStages, int kSegments, bool kHasBias, class kFormat,
          int kClusterM = 1>
struct GemmSm90DecodeTraits : GemmSm90Traits<kBlockN, kStages, kSegments, kHasBias> {
  using Base = GemmSm90Traits<kBlockN, kStages, kSegments, kHasBias>;
  // consume_tiles' bias loads one at a time: with a store round's 16 live at once its 128-register
  // consumers spill (block_n 192 with bias, NVRTC, session 30).
  static constexpr bool bias_loads_together = false;
  using Format = kFormat;
  static constexpr int bits = Format::bits;  // 4 or 8 per code
  static constexpr int code_stages = kCodeStages;
  static constexpr int code_row_bytes = Base::block_k * bits / 8;  // 32 or 64: one row's codes of a slice
  static constexpr int code_chunk_bytes = bits;                    // 8 codes: one 16-byte W chunk
  static constexpr int code_slot_bytes = gemm_sm90_decode_code_slot_bytes(kBlockN, kClusterM, bits);
  static constexpr int code_ring_bytes = code_stages * code_slot_bytes;
  static constexpr int dynamic_shared_bytes =
      gemm_sm90_decode_dynamic_shared_bytes(kBlockN, kClusterM, kStages, kCodeStages, bits);
  // A decoder thread's unit of work: 16 code bytes of one row (32 k of 4-bit codes, 16 of 8-bit ones),
  // one 16-byte shared load, unit_chunks 16-byte W stores and one group scale (nvfp4's 16-k groups: two).
  // A thread once took 8 k of rows 8-32 apart, each with its own scale to load and convert (session 19).
  static constexpr int unit_k = 128 / bits;
  static constexpr int unit_chunks = unit_k / 8;
  static constexpr int units_per_row = Base::block_k / unit_k;                                // 2 or 4
  static constexpr int group_size = Format::group_size > 0 ? Format::group_size : (1 << 30);  // -1: a row
  static constexpr int unit_groups = group_size < unit_k ? unit_k / group_size : 1;
  // Two decoder warpgroups (0 and 1; 2 and 3 consume): one decoder warp per SM sub-partition left their
  // dependent chains exposed (session 16: ~0.2 instructions per cycle per warp), two hide each other's.
  static constexpr int decoder_warpgroups = 2;
  static constexpr int decoder_threads = 128 * decoder_warpgroups;
  static constexpr int threads = decoder_threads + 128 * Base::consumers;
  // Clusters (consume_tiles and TileWalk read these): the consumers release each slot to every CTA of
  // the cluster, whose decoders copy their shares into it.
  static constexpr int cluster_m = kClusterM;
  static constexpr unsigned empty_arrivals = 4 * Base::consumers * cluster_m;
  static constexpr int share_rows = kBlockN / cluster_m;  // W rows of a slice this CTA decodes (and loads)
  static constexpr int share_bytes = share_rows * sm90::kSwizzle128Bytes;
  static constexpr int remote_bytes = (cluster_m - 1) * share_bytes;  // copied in per slice by the others
  static constexpr int code_box_rows = gemm_sm90_decode_code_box_rows(kBlockN, kClusterM, kSegments);
  // The decoder warps form teams that take turns: team u % decoder_teams decodes ring use u, so each has
  // `decoder_teams` slices' time for one, and one's waits (free slot, codes, scale loads, fence) overlap
  // the others' decoding. With one team all 8 warps decoded every slice and each slice's fixed latency
  // came once per slice on the critical path.
  // Teams take ring and code slots in turn, so each slot's uses must fall to one team (a team waits on a
  // slot's barriers one phase at a time): the most teams, up to 4 (two warps each), that divide both
  // rings and leave a thread at most 96 k of a slice (3 units of 4-bit codes, 6 of 8-bit ones): its codes
  // and two slices' scales are in registers.
  static constexpr int max_passes = 96 / unit_k;
  // AWQ's words: a thread's unit is 64 values (8 rows x 8 k), and the teams are as many as leave a thread at
  // most two units a slice, decoded one after the other (decode_word_slice): 192-wide tiles in pairs
  // (96-row shares) take 4 teams, unpaired 2. With both units' words loaded first they spilled at 192
  // wide, which held those tiles to one unit a thread: 2 teams in pairs (session 22).
  static constexpr bool n_major_words = requires { Format::n_major_words; };
  static constexpr int decoder_teams =
      n_major_words ? gemm_sm90_decoder_teams(kStages, kCodeStages, share_rows, 2, decoder_threads)
                    : gemm_sm90_decoder_teams(kStages, kCodeStages, share_rows, max_passes,
                                              decoder_threads / units_per_row);
  // The consumers free each slot as soon as its wgmmas complete: a slot they held a slice longer was one
  // the decoders could not fill (session 18: both sides waited, the decoders 32% of their samples on a
  // free slot, the consumers 64% on a full one).
  static constexpr bool release_each_slot = true;
  static constexpr int team_threads = decoder_threads / decoder_teams;
  static constexpr int team_warps = team_threads / 32;
  static constexpr int rows_per_pass = team_threads / units_per_row;  // 4-bit: 128, 64 or 32; 8-bit: half
  // Units per thread per slice; a last, partial pass (e.g. 16 rows of 48 or 80) takes the team's first
  // warps.
  static constexpr int passes = (share_rows + rows_per_pass - 1) / rows_per_pass;
  // The share row whose codes and scales team thread `thread` loads in pass `pass`. A last, partial pass's
  // threads past the share (shares of 48 or 80 rows) decode nothing and load the share's last row: a row
  // past the share lies past the share's code slot, and may lie in the next segment, outside the one
  // looked up for the share (session 20: 96 x2 read past a 512-row segment's scales).
  __device__ __forceinline__ static int loaded_row(int pass, int thread) {
    const int row = rows_per_pass * pass + thread / units_per_row;
    if constexpr (share_rows % rows_per_pass != 0) {
      if (pass == passes - 1) return min(row, share_rows - 1);
    }
    return row;
  }

  // Registers after setmaxnreg. The CTA keeps what it was launched with, 512 x 128 (the launch bound's
  // 65536 / 512): what the consumers' setmaxnreg.inc takes, the decoders' .dec must have given back first,
  // or .inc waits forever (the first build hung on that). So 256 x decoder + 256 x consumer <= 512 x 128:
  // the consumers of a tile up to 192 wide (96 accumulators) take 152, the decoders 104.
  static constexpr int consumer_registers = 152;
  static constexpr int decoder_registers =
      (gemm_sm90_launch_registers(threads) - 128 * Base::consumers * consumer_registers) / decoder_threads /
      8 * 8;
  // AWQ's words (n_major_words: qweight [K, N / 8], a word 8 rows of one k; see AwqWeights): a code slot
  // holds its pieces as TMA writes them, [code_box_rows / 8 words, 64 k] each, [64 k][piece_columns] words.
  // A decoder thread's unit is then one word column (8 rows) x one chunk (8 k): 8 four-byte loads and 8
  // sixteen-byte stores; a slice of the share holds share_rows such units, taken chunk first (WordUnit).
  static constexpr int piece_columns = code_box_rows / 8;
  static constexpr int word_passes = (share_rows + team_threads - 1) / team_threads;
  static_assert(!n_major_words || word_passes <= 2, "AWQ's words: at most two units a thread a slice");

  // Full-barrier arrivals per phase: one arrive_expect_tx for A, then one per warp of the decoding team.
  static constexpr unsigned full_arrivals = 1 + team_warps;

  static_assert(bits == 4 || bits == 8, "4-bit codes two per byte, or 8-bit bytes");
  static_assert(kBlockN <= 192, "the consumers' 96 accumulators at most (see consumer_registers)");
  // GPTQ's words (k_major_words: qweight [K / 8, N], a word 8 k of one row; see GptqWeights): a code slot
  // holds its pieces as TMA writes them, [8 word rows (64 k)][code_box_rows words] each. A unit (32 k of
  // one row) is then 4 four-byte loads of one word column, the same 16 bytes in the same order as a
  // row-byte format's unit (a byte two consecutive k, low nibble first), decoded alike.
  static constexpr bool k_major_words = requires { Format::k_major_words; };
  static_assert(!k_major_words || (bits == 4 && unit_k == 32), "GPTQ's words: 4-bit codes, 4 words a unit");
  static_assert(!n_major_words || (bits == 4 && code_box_rows % 32 == 0),
                "AWQ's words: 4-bit codes, code boxes of whole 16-byte rows of words (32 W rows)");
  static_assert(cluster_m == 1 || cluster_m == 2 || cluster_m == 4, "clusters of 1, 2 or 4 CTAs along M");
  static_assert(Base::group_m % cluster_m == 0, "a rasterization group holds whole clusters");
  static_assert(share_rows % 16 == 0 && share_rows % code_box_rows == 0,
                "a CTA's share is whole code boxes and whole half passes (16 rows), so each share also "
                "starts on a swizzle atom (8 rows)");
  static_assert(group_size % unit_k == 0 || unit_k % group_size == 0, "a unit holds whole groups, or one");
  static_assert(!Format::has_offset || unit_groups == 1 || n_major_words, "one affine offset per unit");
  static_assert((share_rows % rows_per_pass) * units_per_row % 32 == 0, "a partial pass is whole warps");
  static_assert(code_box_rows * code_row_bytes % 128 == 0 && code_slot_bytes % 128 == 0,
                "code pieces 128-byte aligned");
  static_assert(Base::ring_bytes % 1024 == 0 && kGemmSm90StagingBytes % 1024 == 0,
                "the staging boxes 1024-byte aligned after the ring, and the code ring 128-byte aligned");
  static_assert(code_stages >= 2, "the code ring needs at least two slots");
  static_assert(kStages % decoder_teams == 0 && code_stages % decoder_teams == 0,
                "each ring slot and code slot is one team's: its uses are that team's, in order");
  static_assert(dynamic_shared_bytes <= 227 * 1024, "more shared memory than an H100/H200 SM gives a CTA");
  static_assert(decoder_registers >= 24 && decoder_registers % 8 == 0, "setmaxnreg takes 24..256, by 8");
  static_assert(decoder_threads * decoder_registers + 128 * Base::consumers * consumer_registers <=
                    gemm_sm90_launch_registers(threads),
                "setmaxnreg targets exceed the registers the CTA launched with");
};

// The stored form of a format's affine offset (Format::OffsetCode where has_offset).
template <class Format, bool = Format::has_offset>
struct OffsetCodeOf {
  using type = float;
};
template <class Format>
struct OffsetCodeOf<Format, true> {
  using type = typename Format::OffsetCode;
};

// A decoder thread's stored group scales (and affine offsets) of one slice: its pass i is the unit (see
// GemmSm90DecodeTraits::unit_k) of W row n0 + rows_per_pass i + thread / units_per_row at k k0 + unit_k
// (thread % units_per_row), which has one group scale (nvfp4's 16-k groups: two). Loaded a slice ahead,
// unconditionally (from row N - 1 and group 0 past N and K: a load under `valid` would be a branch per
// pass), and nothing here reads what was loaded: the first instruction that does waits for the load, so the
// conversion (scale_value) and the zeroing of units past N or K wait until the slice is decoded
// (SliceScaleValues), after its barriers. Converting at load time had every decoder wait one L2 round trip
// per slice (session 17).
template <class Traits>
struct SliceScales {
  using Format = typename Traits::Format;
  typename Format::ScaleCode code[Traits::passes][Traits::unit_groups];
  typename OffsetCodeOf<Format>::type offset[Format::has_offset ? Traits::passes : 1];
  unsigned valid;  // bit i: pass i's row is inside N and its unit inside K

  __device__ __forceinline__ void load(const GemmParams& gemm, int n0, int k0, int thread) {
    // A share inside one segment (all but one that straddles a q | k | v boundary; rows past N count as the
    // last segment's) looks its segment up once, not once per pass.
    const GemmSegment first = segment_of<Traits::segments>(gemm, n0);
    if (Traits::segments == 1 || n0 + Traits::share_rows <= first.n_end || first.n_end >= gemm.n) {
      load_rows<true>(gemm, first, n0, k0, thread);
    } else {
      load_rows<false>(gemm, first, n0, k0, thread);
    }
  }

  template <bool kOneSegment>
  __device__ __forceinline__ void load_rows(const GemmParams& gemm, const GemmSegment& first, int n0, int k0,
                                            int thread) {
    // K is a multiple of unit_k (16-byte code rows), so a unit lies inside K or wholly past it.
    const int k = k0 + Traits::unit_k * (thread % Traits::units_per_row);
    const bool in_k = k < gemm.k;
    const int group = in_k ? k / Traits::group_size : 0;
    valid = 0;
#pragma unroll
    for (int pass = 0; pass < Traits::passes; ++pass) {
      const int n = n0 + Traits::loaded_row(pass, thread);
      const int row = min(n, gemm.n - 1);
      const GemmSegment segment = kOneSegment ? first : segment_of<Traits::segments>(gemm, row);
#pragma unroll
      for (int g = 0; g < Traits::unit_groups; ++g)
        code[pass][g] = Format::scale_code(segment, row - segment.n_begin, group + g, gemm.k);
      if constexpr (Format::has_offset)
        offset[pass] = Format::offset_code(segment, row - segment.n_begin, group, gemm.k);
      valid |= (in_k && n < gemm.n ? 1u : 0u) << pass;  // (rows past the share write nothing)
    }
  }
};

// mxfp4's codes go straight to bf16 (its E8M0 scales are powers of two, so the product is exact either
// way): the three E2M1 bits e1 e0 m of a code placed at bf16 bits 8..6 (sign at 15) are its value times
// 2^-126, e1 e0 = 0 (0 and 0.5) as a bf16 subnormal, so one bf16x2 multiply by s * 2^126 gives the pair
// as the f32 route (code * s rounded once to bf16) does: the product has one significant bit more than the
// code and a power-of-two scale, nothing to round, for s <= 2 (E8M0 exponents up to 128, whose multiplier
// is the bf16 with biased exponent e + 126, made from the byte alone; larger ones, NaN's 255 included,
// take the guarded decode). Two instructions a pair fewer than via f32.
template <class Format>
inline constexpr bool kBf16Codes = false;
template <>
inline constexpr bool kBf16Codes<Mxfp4Weights> = true;

// The largest E2M1 scale the f32 route folds: s / code_pair_unit must not overflow.
template <class Format>
inline constexpr float kMaxFoldedScale = 0x1.fffffep+127f * Format::code_pair_unit;

// The byte's two codes (low nibble = even k) as bf16 bits times 2^-126.
__device__ __forceinline__ unsigned e2m1_pair_to_bf16x2_bits(unsigned byte) {
  const unsigned magnitudes =
      (byte * ((1u << 6) | (1u << 18))) & 0x01C001C0u;                      // bits 0-2 -> 6-8, 4-6 -> 22-24
  const unsigned signs = (byte * ((1u << 12) | (1u << 24))) & 0x80008000u;  // bit 3 -> 15, 7 -> 31
  return magnitudes | signs;
}

__device__ __forceinline__ unsigned bf16x2_multiply(unsigned a, unsigned b) {
  unsigned product;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(product) : "r"(a), "r"(b));
  return product;
}

// The slice's scales as the decode multiplies by them (0 for units past N or K, whose codes are TMA's
// zeros), from SliceScales once its loads have landed: f32 scales divided by code_pair_unit, or for
// kBf16Codes the bf16 multiplier s * 2^126 twice.
template <class Traits>
struct SliceScaleValues {
  using Format = typename Traits::Format;
  static constexpr bool kBf16 = kBf16Codes<Format>;
  float scale[kBf16 ? 1 : Traits::passes][Traits::unit_groups];
  unsigned bf16_scale[kBf16 ? Traits::passes : 1];
  float offset[Format::has_offset ? Traits::passes : 1];
  unsigned valid;
  // Whether any unit's E2M1 scale is too large to fold (within 2^14 of overflow; for kBf16Codes, above 2
  // or NaN): then the slice takes the guarded decode.
  bool unfolded;

  // thread: the team thread whose scales these are (its rows select a GPTQ zero point's nibble).
  __device__ __forceinline__ SliceScaleValues(const SliceScales<Traits>& stored, int thread)
      : valid(stored.valid) {
    constexpr float kUnit = Format::code_pair_unit;
    bool folds = true;
#pragma unroll
    for (int pass = 0; pass < Traits::passes; ++pass) {
      const bool inside = (stored.valid >> pass) & 1u;
      if constexpr (kBf16) {
        const unsigned e = stored.code[pass][0];
        folds = folds && !(inside && e > 128u);
        const unsigned bits = inside ? (e + 126u) << 7 : 0u;
        bf16_scale[pass] = bits | bits << 16;
      } else {
#pragma unroll
        for (int g = 0; g < Traits::unit_groups; ++g) {
          const float s = inside ? Format::scale_value(stored.code[pass][g]) : 0.0f;
          if constexpr (kUnit != 1.0f) folds = folds && !(fabsf(s) > kMaxFoldedScale<Format>);  // NaN folds
          scale[pass][g] = s * (1.0f / kUnit);  // exact where it folds
        }
      }
      if constexpr (Format::has_offset) {
        // Shares start on 8-row atoms and segments on multiples of 8 rows: the share row's nibble is the
        // segment row's. The offset's scale is the unit's (one group: unit_groups is 1 with an offset).
        const float s = Format::scale_value(stored.code[pass][0]);
        offset[pass] =
            inside ? Format::offset_value(stored.offset[pass], s, Traits::loaded_row(pass, thread)) : 0.0f;
      }
    }
    unfolded = !folds;
  }
};

// Team thread `thread`'s units of one slice, decoded and stored (see decode_slice). Each unit is one
// 16-byte load of codes and unit_chunks 16-byte stores.
template <class Traits>
__device__ __forceinline__ void decode_units(unsigned char* w, const SliceScaleValues<Traits>& scales,
                                             const unsigned char* codes, int thread) {
  using Format = typename Traits::Format;
  const int unit = thread % Traits::units_per_row;
  const int first_row = thread / Traits::units_per_row;
  // Every unit's codes first: shared loads that no store of the slice has to wait behind.
  uint4 loaded[Traits::passes];
#pragma unroll
  for (int pass = 0; pass < Traits::passes; ++pass) {
    const int loaded_row = Traits::loaded_row(pass, thread);
    if constexpr (Traits::k_major_words) {
      // Word rows 4 unit .. 4 unit + 3 of the row's column in its piece. The two units of a warp's rows
      // lie 4 code_box_rows words apart, a multiple of 32: each load is two wavefronts, not one.
      constexpr int kColumns = Traits::code_box_rows;
      const unsigned* const piece = reinterpret_cast<const unsigned*>(
          codes + loaded_row / kColumns * kColumns * Traits::code_row_bytes);
      const unsigned* const column = piece + 4 * unit * kColumns + loaded_row % kColumns;
      loaded[pass] = make_uint4(column[0], column[kColumns], column[2 * kColumns], column[3 * kColumns]);
    } else {
      loaded[pass] = *reinterpret_cast<const uint4*>(codes + loaded_row * Traits::code_row_bytes + unit * 16);
    }
  }
#pragma unroll
  for (int pass = 0; pass < Traits::passes; ++pass) {
    const int row = Traits::rows_per_pass * pass + first_row;  // of the share
    if (row >= Traits::share_rows) continue;                   // a last, partial pass (whole warps)
    const unsigned words[4] = {loaded[pass].x, loaded[pass].y, loaded[pass].z, loaded[pass].w};
    const float offset = Format::has_offset ? scales.offset[Format::has_offset ? pass : 0] : 0.0f;
#pragma unroll
    for (int c = 0; c < Traits::unit_chunks; ++c) {
      unsigned pairs[4];
      if constexpr (kBf16Codes<Format>) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          pairs[e] = bf16x2_multiply(e2m1_pair_to_bf16x2_bits((words[c] >> (8 * e)) & 0xFFu),
                                     scales.bf16_scale[pass]);
      } else {
        const float s = scales.scale[pass][c * Traits::unit_groups / Traits::unit_chunks];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pairs[e] = Traits::bits == 4
                         ? dequantize_code_pair<Format>(words[c] >> (8 * e), s, offset)
                         : dequantize_code_pair<Format>(words[2 * c + e / 2] >> (16 * (e % 2)), s, offset);
        }
      }
      const int chunk = Traits::unit_chunks * unit + c;
      *reinterpret_cast<uint4*>(w + row * sm90::kSwizzle128Bytes + ((chunk ^ (row % 8)) << 4)) =
          make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
  }
}

// The rare slice with an E2M1 scale too large to fold: every unit through the format's own decode, which
// reloads its scale and guards the fold itself (units past N or K are zeros).
template <class Traits>
__device__ __forceinline__ void decode_units_guarded(const GemmParams& gemm, unsigned char* w,
                                                     const SliceScaleValues<Traits>& scales,
                                                     const unsigned char* codes, int n0, int k0, int thread) {
  using Format = typename Traits::Format;
  const int unit = thread % Traits::units_per_row;
  const int first_row = thread / Traits::units_per_row;
#pragma unroll 1
  for (int pass = 0; pass < Traits::passes; ++pass) {
    const int row = Traits::rows_per_pass * pass + first_row;
    if (row >= Traits::share_rows) continue;
    const bool inside = (scales.valid >> pass) & 1u;
    const int n = n0 + row;
    const GemmSegment segment = segment_of<Traits::segments>(gemm, min(n, gemm.n - 1));
#pragma unroll
    for (int c = 0; c < Traits::unit_chunks; ++c) {
      const int chunk = Traits::unit_chunks * unit + c;
      float values[8] = {};
      if (inside) {
        Format::dequantize(codes + row * Traits::code_row_bytes + chunk * Traits::code_chunk_bytes, segment,
                           n - segment.n_begin, k0 + 8 * chunk, gemm.k, values);
      }
      unsigned pairs[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(values[2 * e], values[2 * e + 1]);
        pairs[e] = *reinterpret_cast<const unsigned*>(&pair);
      }
      *reinterpret_cast<uint4*>(w + row * sm90::kSwizzle128Bytes + ((chunk ^ (row % 8)) << 4)) =
          make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
  }
}

// AWQ's words (Traits::n_major_words). Team thread `thread`'s unit in pass `pass`: word column `column`
// of the share (W rows 8 column .. 8 column + 7) and chunk `chunk` of the slice (its k 8 chunk .. 8 chunk
// + 7), chunk first: the 8 lanes of a quarter warp take the 8 chunks of one column, so each of their
// 16-byte stores of a row puts 8 different swizzled chunks in one wavefront. A last, partial pass's
// threads past the share take its last unit and store nothing.
template <class Traits>
struct WordUnit {
  int column, chunk;
  bool inside;
  __device__ __forceinline__ WordUnit(int pass, int thread) {
    const int unit = Traits::team_threads * pass + thread;
    inside = unit < Traits::share_rows;
    const int each = inside ? unit : Traits::share_rows - 1;
    column = each / 8;
    chunk = each % 8;
  }
  // The code slot's pieces are [64 k][piece_columns] words, so the 8 chunks of a column lie piece_columns
  // x 8 words apart: in one bank where that is a multiple of 32. A lane reads its 8 words in the order
  // e ^ rotation (rotation = chunk % 4), which spreads a quarter warp's loads over 4 banks: 2-way conflicts
  // for 64-row shares (8 words a k row), 4-way for 128, none for 32-row pieces.
  __device__ __forceinline__ int rotation() const { return chunk & 3; }
  __device__ __forceinline__ int first_word() const {  // of k 8 chunk, in the slot
    constexpr int piece_columns = Traits::piece_columns;
    return column / piece_columns * (Traits::block_k * piece_columns) + 8 * chunk * piece_columns +
           column % piece_columns;
  }
};

// A decoder thread's stored scale and zero points of one slice for AWQ's words, loaded a slice ahead as
// SliceScales' are. The 8 lanes of a quarter warp decode one word column (rows 8 column .. + 7), so lane
// `chunk` holds the scale of row 8 column + chunk and decode_word_slice takes each row's from its lane
// (shfl): 8 scales a thread, twice over (this slice's and the next's), spilled in some specializations. Every
// chunk of a slice lies in the group of its first k (groups are whole slices: AwqWeights on this kernel has
// groups of a multiple of 64, or one), so the 8 lanes load one group even where the slice runs past K.
template <class Traits>
struct WordSliceScales {
  using Format = typename Traits::Format;
  static_assert(Format::group_size < 0 || Format::group_size % Traits::block_k == 0,
                "a slice lies in one group: each lane holds one row's scale for its quarter warp");
  float scale[Traits::word_passes];     // row 8 column + chunk's
  unsigned zeros[Traits::word_passes];  // the column's qzeros word
  unsigned valid;                       // bit i: pass i's unit is inside the share, N and K

  __device__ __forceinline__ void load(const GemmParams& gemm, int n0, int k0, int thread) {
    valid = 0;
    const int group = Format::group_size > 0 ? k0 / Format::group_size : 0;  // k0 < K: a slice exists
#pragma unroll
    for (int pass = 0; pass < Traits::word_passes; ++pass) {
      const WordUnit<Traits> unit(pass, thread);
      const int n = n0 + 8 * unit.column;
      // Past N (whole word columns: AWQ's segments are whole 32-row pieces): N's last column.
      const int row = min(n, gemm.n - 8);
      const GemmSegment segment = segment_of<Traits::segments>(gemm, row);
      const int first = row - segment.n_begin;
      scale[pass] = group_major_scale(segment, first + unit.chunk, group);
      zeros[pass] = Format::zero_word(segment, first, group);
      valid |= (unit.inside && k0 + 8 * unit.chunk < gemm.k && n < gemm.n ? 1u : 0u) << pass;
    }
  }
};

// The slice's units of AWQ's words: share codes [64 k][share_rows / 8] words (in pieces) -> W [share_rows,
// 64] bf16 at `w`, swizzled as decode_slice says below. Each value is (q - z) * s in f32, rounded once to
// bf16: AwqWeights::dequantize's, bit for bit. q - z comes exact from fp16: a code masked in place inside
// its byte is the low mantissa of fp16 1024 (1024 + q for an even nibble, 1024 + 16 q for an odd one), and
// 1024 + z (1024 + 16 z) is subtracted; the odd nibble's scale is s / 16 (exact). Row r of a column sits at
// nibble AwqWeights::nibble_of_column(r) of its words: every shift, mask and byte selector is a constant.
template <class Traits>
__device__ __forceinline__ void decode_word_slice(const unsigned char* codes, unsigned char* w,
                                                  const WordSliceScales<Traits>& stored, int thread) {
  using Format = typename Traits::Format;
  const unsigned* const words = reinterpret_cast<const unsigned*>(codes);
  // One unit at a time (two a thread where four teams share 96 rows): two units' words and decodes
  // interleaved spilled.
#pragma unroll 1
  for (int pass = 0; pass < Traits::word_passes; ++pass) {
    // Threads of a partial pass (whole quarter warps past the share) decode with the others, for the
    // shuffles, and store nothing.
    const WordUnit<Traits> unit(pass, thread);
    const int rotation = unit.rotation();
    // x[e] holds the word of k 8 chunk + (e ^ rotation), then (below) of k 8 chunk + e.
    unsigned x[8];
    const unsigned* const at = words + unit.first_word();
    // This pass's scale and zeros by selects: indexed with the loop's `pass` they would go through local
    // memory.
    float scale = stored.scale[0];
    unsigned zero_word = stored.zeros[0];
#pragma unroll
    for (int p = 1; p < Traits::word_passes; ++p) {
      scale = pass == p ? stored.scale[p] : scale;
      zero_word = pass == p ? stored.zeros[p] : zero_word;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      x[e] = at[(e ^ rotation) * Traits::piece_columns];
    }
    // Undo the rotation: x[e] becomes the word of k 8 chunk + e.
#pragma unroll
    for (int bit = 1; bit <= 2; bit *= 2) {
      const bool swap = (rotation & bit) != 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (e & bit) continue;
        const unsigned a = x[e], b = x[e | bit];
        x[e] = swap ? b : a;
        x[e | bit] = swap ? a : b;
      }
    }
    const bool inside = (stored.valid >> pass) & 1u;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int nibble = Format::nibble_of_column(r);
      const bool odd = nibble & 1;
      // Byte 0 of a selection <- byte nibble / 2 of word 2q, byte 2 <- the same byte of word 2q + 1.
      const unsigned select = static_cast<unsigned>(nibble / 2) * 0x0101u + 0x0400u;
      const unsigned mask = odd ? 0x00F000F0u : 0x000F000Fu;
      const unsigned zero = (zero_word >> (4 * nibble)) & 15u;
      const unsigned zero_bits = zero * (odd ? 0x00100010u : 0x00010001u) + 0x64006400u;
      const float row_scale = __shfl_sync(0xFFFFFFFFu, scale, r, 8);
      const float s = inside ? row_scale * (odd ? 0.0625f : 1.0f) : 0.0f;
      unsigned pairs[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const unsigned biased = (__byte_perm(x[2 * q], x[2 * q + 1], select) & mask) | 0x64006400u;
        const float2 codes_minus_zero = __half22float2(__hsub2(
            *reinterpret_cast<const __half2*>(&biased), *reinterpret_cast<const __half2*>(&zero_bits)));
        const __nv_bfloat162 pair = __floats2bfloat162_rn(codes_minus_zero.x * s, codes_minus_zero.y * s);
        pairs[q] = *reinterpret_cast<const unsigned*>(&pair);
      }
      // Row 8 column + r of the share (whose rows start on an 8-row atom): chunk `chunk` at chunk ^ r.
      const int row = 8 * unit.column + r;
      if (unit.inside)
        *reinterpret_cast<uint4*>(w + row * sm90::kSwizzle128Bytes + ((unit.chunk ^ r) << 4)) =
            make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
  }
}

// The stored scales a decoder thread keeps for `Traits`' codes: SliceScales, or WordSliceScales for AWQ.
template <class Traits, bool = Traits::n_major_words>
struct SliceScalesOf {
  using type = SliceScales<Traits>;
};
template <class Traits>
struct SliceScalesOf<Traits, true> {
  using type = WordSliceScales<Traits>;
};

// Team thread `thread` (0..team_threads - 1): its units of one slice, the share's codes
// [share_rows, 64 k] at `codes` -> W [share_rows, 64] bf16 at `w` (the share's first row in the slot;
// 128-byte swizzle: the 16-byte chunk c of row r sits at chunk c ^ (r % 8), shares start on 8-row atoms),
// with the slice's scales. n0, k0: the share's first W row and the slice's first k. Each value is code * s
// (+ offset) in f32, rounded once to bf16, as the dequantize kernel and the mma.sync loaders compute it: s
// / code_pair_unit is exact (a power of two), except for E2M1 scales within 2^14 of overflow (E8M0
// exponents 241 and up; for mxfp4, decoded in bf16 (kBf16Codes), scales above 2), whose slices take the
// format's own guarded decode.
template <class Traits>
__device__ __forceinline__ void decode_slice(const GemmParams& gemm, const unsigned char* codes,
                                             unsigned char* w, const SliceScales<Traits>& stored, int n0,
                                             int k0, int thread) {
  const SliceScaleValues<Traits> scales(stored, thread);
  if constexpr (Traits::Format::code_pair_unit != 1.0f) {
    if (scales.unfolded) {
      decode_units_guarded<Traits>(gemm, w, scales, codes, n0, k0, thread);
      return;
    }
  }
  decode_units<Traits>(w, scales, codes, thread);
}

// grid: [min(tiles, SMs)] persistent CTAs, block: [Traits::threads], dynamic shared memory:
// Traits::dynamic_shared_bytes.
template <class Traits>
__global__ void __launch_bounds__(Traits::threads, 1)
    gemm_sm90_decode_kernel(const __grid_constant__ GemmSm90Params params) {
#if ATTNPLAN_SM90A_ENABLED
  extern __shared__ __align__(1024) unsigned char shared[];
  // ring_layout's pieces, with the code ring as the kernel's own (128-byte aligned; shares of 80 or 48
  // rows make it no whole KiB), then the code barriers.
  const auto [ring, staging, code_ring, full_barriers, empty_barriers] =
      ring_layout<Traits::ring_bytes, Traits::stages, Traits::code_ring_bytes>(shared);
  unsigned char* const ring_pointer = shared + (ring - sm90::smem_address(shared));
  const unsigned code_barriers = empty_barriers + Traits::stages * 8;  // [code_stages] x 8 bytes
  const GemmParams& gemm = params.gemm;

  // Counters after the code barriers, so that no decoder waits for the others between slices:
  // [code_stages] per code slot, how many decoder warps have read it (ever): the warp that makes it a
  // multiple of a team's warps reloads the slot; [stages] per ring slot, how many have written their rows
  // of the share: with clusters, the last one copies the share to the other CTAs.
  unsigned* const code_readers = reinterpret_cast<unsigned*>(
      shared + (code_barriers + Traits::code_stages * 8 - sm90::smem_address(shared)));
  unsigned* const share_writers = code_readers + Traits::code_stages;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {  // made visible with the ring's barriers below
    for (int s = 0; s < Traits::code_stages; ++s) {
      sm90::mbarrier_init(code_barriers + 8 * s, 1);
      code_readers[s] = 0;
    }
    for (int s = 0; s < Traits::stages; ++s) share_writers[s] = 0;
  }
  init_ring_barriers<Traits::stages, Traits::empty_arrivals, Traits::full_arrivals>(full_barriers,
                                                                                    empty_barriers);

  constexpr bool clustered = Traits::cluster_m > 1;
  // The other CTAs' barriers must be initialized before this one copies into them or arrives on them.
  if constexpr (clustered) sm90::cluster_sync();
  const unsigned rank = clustered ? sm90::cluster_rank() : 0u;

  const int tiles_m = (gemm.m + Traits::block_m - 1) / Traits::block_m;
  const int tiles_n = (gemm.n + Traits::block_n - 1) / Traits::block_n;
  const int k_tiles = (gemm.k + Traits::block_k - 1) / Traits::block_k;
  const TileWalk<Traits::cluster_m, Traits::group_m> walk{tiles_m, tiles_n, rank};
  // This CTA's share of each W slice: rows [share, share + share_rows) of the tile.
  const int share = static_cast<int>(rank) * Traits::share_rows;

  if (warpgroup < Traits::decoder_warpgroups) {
    // Producer and decoders. Ring use u (slot u % stages, phase (u / stages) % 2) is k slice u % k_tiles of
    // the CTA's (u / k_tiles)-th tile; its codes sit in code slot u % code_stages.
    sm90::setmaxnreg_decrease<Traits::decoder_registers>();
    const int lane = threadIdx.x % 32;
    const int team = threadIdx.x / Traits::team_threads;
    const int thread = threadIdx.x % Traits::team_threads;  // in the team
    const int warp = thread / 32;                           // in the team
    const int units = walk.first() < walk.units() ? (walk.units() - 1 - walk.first()) / walk.stride() + 1 : 0;
    const int uses = units * k_tiles;
    // Use u's tile: the CTA's (u / k_tiles)-th.
    const auto tile_of = [&](int u) { return walk.tile(walk.first() + (u / k_tiles) * walk.stride()); };
    const auto share_n0 = [&](int u) { return tile_of(u).n * Traits::block_n + share; };
    // One thread: the TMA loads of use u's codes of the share (nothing past the last use), in pieces where
    // tiles straddle segments, each through the map of its own segment (a piece past N reads zeros).
    const auto load_codes = [&](int u) {
      if (u >= uses) return;
      const int n0 = share_n0(u);
      const unsigned slot = code_ring + (u % Traits::code_stages) * Traits::code_slot_bytes;
      const unsigned barrier = code_barriers + 8 * (u % Traits::code_stages);
      sm90::mbarrier_arrive_expect_tx(barrier, Traits::share_rows * Traits::code_row_bytes);
#pragma unroll
      for (int piece = 0; piece < Traits::share_rows; piece += Traits::code_box_rows) {
        const SegmentTile codes = segment_tile<Traits::segments>(params, n0 + piece);
        if constexpr (Traits::n_major_words) {  // [64 k, code_box_rows / 8 words]
          sm90::tma_load_2d(slot + piece * Traits::code_row_bytes, codes.map, barrier, codes.row / 8,
                            (u % k_tiles) * Traits::block_k);
        } else if constexpr (Traits::k_major_words) {  // [8 word rows, code_box_rows words]
          sm90::tma_load_2d(slot + piece * Traits::code_row_bytes, codes.map, barrier, codes.row,
                            (u % k_tiles) * (Traits::block_k / 8));
        } else {
          sm90::tma_load_2d(slot + piece * Traits::code_row_bytes, codes.map, barrier,
                            (u % k_tiles) * Traits::code_row_bytes, codes.row);
        }
      }
    };
    if (threadIdx.x == 0) {
      prefetch_tensor_maps<Traits::segments>(params);
      for (int u = 0; u < Traits::code_stages; ++u) load_codes(u);
    }
    // Scales of the slice being decoded, and of the team's next one (in flight while this one is decoded;
    // past the last use: any rows, never used).
    typename SliceScalesOf<Traits>::type scales, next_scales;
    if (team < uses) next_scales.load(gemm, share_n0(team), (team % k_tiles) * Traits::block_k, thread);
    // The team's use u: k slice k_tile of the CTA's tile_index-th tile at `coordinates`, and the same of
    // its next use, stepped without a division per slice.
    int k_tile = team % k_tiles, tile_index = team / k_tiles;
    TileCoordinates coordinates = tile_of(team);
    for (int u = team; u < uses; u += Traits::decoder_teams) {
      const int n0 = coordinates.n * Traits::block_n + share;
      int next_k_tile = k_tile + Traits::decoder_teams, next_tile_index = tile_index;
      while (next_k_tile >= k_tiles) next_k_tile -= k_tiles, ++next_tile_index;
      const bool next_tile = next_tile_index != tile_index && next_tile_index < units;
      const TileCoordinates next_coordinates =
          next_tile ? walk.tile(walk.first() + next_tile_index * walk.stride()) : coordinates;
      scales = next_scales;
      // (past the last use: any rows, never used)
      next_scales.load(gemm, next_coordinates.n * Traits::block_n + share, next_k_tile * Traits::block_k,
                       thread);
      const int slot = u % Traits::stages;
      const unsigned full = full_barriers + 8 * slot;
      // Free in every CTA of the cluster: each one's consumers released it here.
      sm90::mbarrier_wait_parity(empty_barriers + 8 * slot, ((u / Traits::stages) & 1u) ^ 1u);
      const int use_of_team = u / Traits::decoder_teams;
      if (warp == use_of_team % Traits::team_warps && lane == 0) {  // in turn: every team warp waited
        // A, and the other CTAs' shares of W (their copies complete on this barrier). A cluster's CTA past
        // M (the last row of tiles padded to whole clusters) reads the last tile's A rows: any bytes do,
        // its stores fall outside C. It still decodes its share for the others.
        const int m_tile = coordinates.m;
        sm90::mbarrier_arrive_expect_tx(full, Traits::a_slot_bytes + Traits::remote_bytes);
        sm90::tma_load_2d(ring + slot * Traits::slot_bytes, &params.a_map, full, k_tile * Traits::block_k,
                          (clustered ? min(m_tile, tiles_m - 1) : m_tile) * Traits::block_m);
      }
      const int code_slot = u % Traits::code_stages;
      sm90::mbarrier_wait_parity(code_barriers + 8 * code_slot, (u / Traits::code_stages) & 1u);
      const int w_share = slot * Traits::slot_bytes + Traits::a_slot_bytes + share * sm90::kSwizzle128Bytes;
      const unsigned char* const codes =
          ring_pointer + (code_ring - ring) + code_slot * Traits::code_slot_bytes;
      if constexpr (Traits::n_major_words) {
        decode_word_slice<Traits>(codes, ring_pointer + w_share, scales, thread);
      } else {
        decode_slice<Traits>(gemm, codes, ring_pointer + w_share, scales, n0, k_tile * Traits::block_k,
                             thread);
      }
      // The warp's writes, then the arrival this CTA's consumers' wgmmas (async proxy) wait for.
      sm90::fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) {
        sm90::mbarrier_arrive(full);
        if constexpr (clustered) {
          // The last team warp to have written its rows of the share (each fenced them for the async
          // proxy, and the fences order them before the count) has the copy engine take the whole share
          // to the same place in the other CTAs' slots (free: this CTA's empty barrier counted their
          // consumers' releases too). One copy per CTA and slice: 24 of 4 rows each were slower
          // (branch notes, kernels-notes.md "Session 17").
          __threadfence_block();
          const unsigned writers = atomicAdd(&share_writers[slot], 1u) + 1u;
          if (writers % Traits::team_warps == 0) {
            __threadfence_block();
#pragma unroll
            for (unsigned other = 1; other < Traits::cluster_m; ++other) {
              sm90::bulk_copy_to_cluster(ring + w_share, Traits::share_bytes, full,
                                         (rank + other) % Traits::cluster_m);
            }
          }
        }
        // The last team warp to have read this code slot reloads it, code_stages slices ahead.
        const unsigned readers = atomicAdd(&code_readers[code_slot], 1u) + 1u;
        if (readers % Traits::team_warps == 0) load_codes(u + Traits::code_stages);
      }
      k_tile = next_k_tile;
      tile_index = next_tile_index;
      coordinates = next_coordinates;
    }
    // The other CTAs may still copy into this one's ring and arrive on its barriers until they are done.
    if constexpr (clustered) sm90::cluster_sync();
    return;
  }

  // Consumers: warpgroup 1 + c (c = 1, 2) owns tile rows [64 (c - 1), 64 c), as in the bf16 kernel.
  consume_tiles<Traits>(params, ring, staging, full_barriers, empty_barriers,
                        warpgroup - (Traits::decoder_warpgroups - 1), walk, k_tiles);
  if constexpr (clustered) sm90::cluster_sync();  // see the decoders'
#else
  (void)params;
  __trap();  // an sm_90a kernel instantiated for another target
#endif
}

}  // namespace attnplan::kernels
