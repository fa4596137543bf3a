// The QKV postprocess kernel's typed spec (templates/attnplan/qkv_postprocess.cuh): per-head q/k/v
// RMSNorm and RoPE in place on the fused QKV projection output (spec sections 3 and 4), and its pure
// launch heuristic.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "compiler/kernel_source.hpp"
#include "config/attention_config.hpp"

namespace attnplan::plan {

// One block per token; its warps take the token's head rows in turn. Each warp holds a head row with
// one vector per lane (lane l owns vectors l, l + 32, ...), so the vector is as wide as it can be while
// still giving every lane of the warp a share of the row.
struct QkvPostprocessTiling {
  int threads = 256;     // per block: whole warps
  int head_vector = 4;   // bf16 elements per access in q and k heads
  int value_vector = 4;  // bf16 elements per access in v heads
};

// What the tiling depends on: the row layout and how many head rows the kernel changes per token.
struct QkvPostprocessShape {
  int query_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int value_head_dim = 0;
  int head_rows = 0;        // q, k and v head rows changed per token (QkvPostprocessSpec::head_rows)
  bool value_norm = false;  // v heads are touched at all
};
QkvPostprocessTiling choose_qkv_postprocess_tiling(const QkvPostprocessShape& shape);

// The widest of {8, 4, 2, 1} bf16 elements that divides `dim` and leaves a warp of 32 lanes at least one
// vector each; 1 for rows narrower than a warp of pairs.
int warp_row_vector_width(int dim);

struct QkvPostprocessSpec {
  int query_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int value_head_dim = 0;
  // RoPE (spec section 4). With rotary_dim == 0 (no RoPE) the offset is 0 and the pairing dim 2, so
  // that configs differing only in unused rotary fields share one kernel.
  int rotary_offset = 0;
  int rotary_dim = 0;
  int pairing_dim = 2;
  bool query_norm = false;
  bool key_norm = false;
  bool value_norm = false;   // without weight
  bool unit_offset = false;  // q/k norm weight_offset == 1 (Gemma 3)
  QkvPostprocessTiling tiling;

  // The config's norm flags and RoPE shape, with the tiling of choose_qkv_postprocess_tiling. The
  // runtime values (epsilon: config.qkv_norm_epsilon(); attention factor; the frequency table) are Params.
  static QkvPostprocessSpec from_config(const config::AttentionConfig& config);

  // Head rows the kernel touches per token: q and k heads when a norm or RoPE changes them, v heads when
  // v is normalized. 0 means the kernel would do nothing: a plan need not launch it.
  int head_rows() const;
  bool has_work() const { return head_rows() > 0; }
  // The qkv pointer and the row stride must be multiples of this many elements (the kernel's vectors).
  int row_alignment() const;
  // Elements of one token's row the kernel may touch: Hq * D + Hkv * D + Hkv * Dv.
  long long row_width() const;

  compiler::KernelSource source() const;

  // Whether the sm_90a bf16 GEMM's epilogue can do this postprocess on tiles of `block_n` columns
  // (gemm_sm90_qkv_epilogue.cuh): there is work, the tiles hold whole heads (block_n a multiple of D; of
  // Dv too, equal to D, when v is normalized), each rotated pair lies in one thread's columns (the
  // interleaved pairing P2 = 2 at an even offset, or a half split whose half and offset are multiples of
  // 8), and the rotation table values a thread holds through its tile's end fit beside the accumulators
  // (epilogue_table_floats() <= kMaxEpilogueTableFloats: rotate_half up to R 128, interleaved up to R 128;
  // R 256 spilled 144 bytes). Pure.
  bool fits_gemm_epilogue(int block_n) const;
  // The (cos, sin) floats of the rotation table one consumer thread loads for its two rows of a tile.
  int epilogue_table_floats() const;
  static constexpr int kMaxEpilogueTableFloats = 64;
  // The epilogue's traits type, attnplan::kernels::QkvEpilogueTraits<...>, as C++ source text, and its
  // fields for a manifest (the tiling is the postprocess kernel's own and stays out).
  std::string epilogue_traits() const;
  nlohmann::json epilogue_spec() const;
};

}  // namespace attnplan::plan
