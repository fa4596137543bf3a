#include "plan/qkv_postprocess_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

namespace attnplan::plan {

namespace {
std::string cxx_bool(bool value) {
  return value ? "true" : "false";
}

// Head rows a warp should take in turn. The block waits once for its token's (cos, sin) table (a
// binary search over query_starts, then double math); a few heads per warp pay that wait off, while
// more heads per warp would only lengthen the block without adding parallelism per SM.
constexpr int kRowsPerWarp = 4;
constexpr int kMaxWarps = 8;
}  // namespace

int warp_row_vector_width(int dim) {
  for (const int vector : {8, 4, 2}) {
    if (dim % vector == 0 && dim / vector >= 32) return vector;
  }
  return 1;
}

QkvPostprocessTiling choose_qkv_postprocess_tiling(const QkvPostprocessShape& shape) {
  QkvPostprocessTiling tiling;
  const int warps = std::clamp((shape.head_rows + kRowsPerWarp - 1) / kRowsPerWarp, 1, kMaxWarps);
  tiling.threads = 32 * warps;
  tiling.head_vector = warp_row_vector_width(shape.head_dim);
  // v heads start after Hq + Hkv heads of D; a v vector must not straddle that boundary's alignment.
  // Untouched v heads are never accessed: width 1 keeps the choice out of the kernel's identity.
  tiling.value_vector = 1;
  if (shape.value_norm) {
    const long long value_column =
        static_cast<long long>(shape.query_heads + shape.kv_heads) * shape.head_dim;
    tiling.value_vector = warp_row_vector_width(shape.value_head_dim);
    while (value_column % tiling.value_vector != 0) tiling.value_vector /= 2;
  }
  return tiling;
}

QkvPostprocessSpec QkvPostprocessSpec::from_config(const config::AttentionConfig& config) {
  QkvPostprocessSpec spec;
  spec.query_heads = config.query_heads;
  spec.kv_heads = config.kv_heads;
  spec.head_dim = config.head_dim;
  spec.value_head_dim = config.value_head_dim;
  spec.rotary_dim = config.rotary_dim();
  if (spec.rotary_dim > 0) {
    spec.rotary_offset = config.rotary.offset;
    spec.pairing_dim = config.pairing_dim();
  }
  spec.query_norm = config.qkv_norm.query;
  spec.key_norm = config.qkv_norm.key;
  spec.value_norm = config.qkv_norm.value;
  // validate() admits only 0 and 1; the offset only matters when a weighted norm is on.
  spec.unit_offset = (spec.query_norm || spec.key_norm) && config.qkv_norm.weight_offset == 1.0;
  spec.tiling = choose_qkv_postprocess_tiling({.query_heads = spec.query_heads,
                                               .kv_heads = spec.kv_heads,
                                               .head_dim = spec.head_dim,
                                               .value_head_dim = spec.value_head_dim,
                                               .head_rows = spec.head_rows(),
                                               .value_norm = spec.value_norm});
  return spec;
}

int QkvPostprocessSpec::head_rows() const {
  const bool rope = rotary_dim > 0;
  return (query_norm || rope ? query_heads : 0) + (key_norm || rope ? kv_heads : 0) +
         (value_norm ? kv_heads : 0);
}

int QkvPostprocessSpec::row_alignment() const {
  return std::max(tiling.head_vector, tiling.value_vector);
}

long long QkvPostprocessSpec::row_width() const {
  return static_cast<long long>(query_heads + kv_heads) * head_dim +
         static_cast<long long>(kv_heads) * value_head_dim;
}

compiler::KernelSource QkvPostprocessSpec::source() const {
  compiler::KernelSource source;
  source.family = "qkv_postprocess";
  source.header = "attnplan/qkv_postprocess.cuh";
  source.traits = "attnplan::kernels::QkvPostprocessTraits";
  source.kernel = "attnplan::kernels::qkv_postprocess_kernel";
  source.arguments = {
      {"query_heads", std::to_string(query_heads)},
      {"kv_heads", std::to_string(kv_heads)},
      {"head_dim", std::to_string(head_dim)},
      {"value_head_dim", std::to_string(value_head_dim)},
      {"rotary_offset", std::to_string(rotary_offset)},
      {"rotary_dim", std::to_string(rotary_dim)},
      {"pairing_dim", std::to_string(pairing_dim)},
      {"query_norm", cxx_bool(query_norm)},
      {"key_norm", cxx_bool(key_norm)},
      {"value_norm", cxx_bool(value_norm)},
      {"unit_offset", cxx_bool(unit_offset)},
      {"threads", std::to_string(tiling.threads)},
      {"head_vector", std::to_string(tiling.head_vector)},
      {"value_vector", std::to_string(tiling.value_vector)},
  };
  source.spec = {{"family", source.family},
                 {"query_heads", query_heads},
                 {"kv_heads", kv_heads},
                 {"head_dim", head_dim},
                 {"value_head_dim", value_head_dim},
                 {"rotary_offset", rotary_offset},
                 {"rotary_dim", rotary_dim},
                 {"pairing_dim", pairing_dim},
                 {"query_norm", query_norm},
                 {"key_norm", key_norm},
                 {"value_norm", value_norm},
                 {"unit_offset", unit_offset},
                 {"threads", tiling.threads},
                 {"head_vector", tiling.head_vector},
                 {"value_vector", tiling.value_vector}};
  return source;
}

int QkvPostprocessSpec::epilogue_table_floats() const {
  if (rotary_dim == 0) return 0;
  // Head blocks of 8 columns holding rotated pairs' a's (half split: each 8 consecutive pairs, a float4
  // of two per thread and row) or any rotated dim (interleaved: a float2 per thread and row).
  if (pairing_dim == 2) {
    const int first = rotary_offset / 8, last = (rotary_offset + rotary_dim - 1) / 8;
    return (last - first + 1) * 2 * 2;
  }
  return (rotary_dim / 2 + 7) / 8 * 2 * 4;
}

bool QkvPostprocessSpec::fits_gemm_epilogue(int block_n) const {
  if (!has_work() || head_dim <= 0 || head_dim % 8 != 0 || block_n % head_dim != 0) return false;
  if (value_norm && value_head_dim != head_dim) return false;
  if (rotary_dim == 0) return true;
  if (epilogue_table_floats() > kMaxEpilogueTableFloats) return false;
  if (pairing_dim == 2) return rotary_offset % 2 == 0;
  return (pairing_dim / 2) % 8 == 0 && rotary_offset % 8 == 0;
}

std::string QkvPostprocessSpec::epilogue_traits() const {
  return fmt::format("attnplan::kernels::QkvEpilogueTraits<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
                     query_heads, kv_heads, head_dim, value_head_dim, rotary_offset, rotary_dim, pairing_dim,
                     cxx_bool(query_norm), cxx_bool(key_norm), cxx_bool(value_norm), cxx_bool(unit_offset));
}

nlohmann::json QkvPostprocessSpec::epilogue_spec() const {
  return {{"query_heads", query_heads},       {"kv_heads", kv_heads},           {"head_dim", head_dim},
          {"value_head_dim", value_head_dim}, {"rotary_offset", rotary_offset}, {"rotary_dim", rotary_dim},
          {"pairing_dim", pairing_dim},       {"query_norm", query_norm},       {"key_norm", key_norm},
          {"value_norm", value_norm},         {"unit_offset", unit_offset}};
}

}  // namespace attnplan::plan
