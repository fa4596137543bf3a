#include "plan/gemm_common.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "driver/cuda_api.hpp"

namespace attnplan::plan {

namespace {

bool aligned(const void* pointer, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

}  // namespace

bool check_gemm_operands(const GemmParams& params, int segments, bool has_bias, std::string_view kernel,
                         const std::function<void(int index, const GemmSegment& segment)>& segment_rules) {
  const auto require = [kernel](bool condition, const std::string& message) {
    if (!condition) throw Error(Stage::input, fmt::format("{}: {}", kernel, message));
  };
  require(params.m >= 0 && params.n >= 0 && params.k >= 0,
          fmt::format("negative size (M = {}, N = {}, K = {})", params.m, params.n, params.k));
  if (params.m == 0 || params.n == 0) return false;
  require(params.lda >= params.k && params.lda % 8 == 0,
          fmt::format("lda = {} must be >= K = {} and a multiple of 8", params.lda, params.k));
  require(params.ldc >= params.n && params.ldc % 8 == 0,
          fmt::format("ldc = {} must be >= N = {} and a multiple of 8", params.ldc, params.n));
  require(params.a != nullptr && aligned(params.a, 16), "a: null or not 16-byte aligned");
  require(params.c != nullptr && aligned(params.c, 16), "c: null or not 16-byte aligned");
  require(segments >= 1 && segments <= kMaxGemmSegments,
          fmt::format("the spec has {} segments; 1 to {} are supported", segments, kMaxGemmSegments));
  int expected_begin = 0;
  for (int s = 0; s < segments; ++s) {
    const GemmSegment& segment = params.segments[s];
    require(segment.n_begin == expected_begin && segment.n_end > segment.n_begin,
            fmt::format("segments[{}] = [{}, {}) must be non-empty and start at {}", s, segment.n_begin,
                        segment.n_end, expected_begin));
    require(segment.weight != nullptr && aligned(segment.weight, 16),
            fmt::format("segments[{}].weight: null or not 16-byte aligned", s));
    require(has_bias || segment.bias == nullptr,
            fmt::format("segments[{}].bias is set but the kernel was specialized without bias", s));
    require(aligned(segment.bias, 2), fmt::format("segments[{}].bias: not 2-byte aligned", s));
    if (segment_rules) segment_rules(s, segment);
    expected_begin = segment.n_end;
  }
  require(expected_begin == params.n, fmt::format("segments end at {} but N = {}", expected_begin, params.n));
  return true;
}

void encode_tensor_map(TensorMap& map, CUtensorMapDataType type, int element_bytes, const void* base,
                       int columns, int rows, long long row_stride, int box_columns, int box_rows,
                       std::string_view what, CUtensorMapSwizzle swizzle) {
  static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) == alignof(CUtensorMap),
                "TensorMap must have CUtensorMap's layout");
  const cuuint64_t dims[2] = {cuuint64_t(columns), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_stride) * cuuint64_t(element_bytes)};  // bytes between rows
  const cuuint32_t box[2] = {cuuint32_t(box_columns), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  driver::check(driver::api().cuTensorMapEncodeTiled(
                    reinterpret_cast<CUtensorMap*>(&map), type, 2, const_cast<void*>(base), dims, strides,
                    box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                fmt::format("cuTensorMapEncodeTiled ({}: [{}, {}] of {}-byte elements, row stride {})", what,
                            rows, columns, element_bytes, row_stride));
}

}  // namespace attnplan::plan
