#include "plan/tensor_map.hpp"

#include <fmt/format.h>

#include "attnplan/gemm_sm90_params.h"
#include "driver/cuda_api.hpp"

namespace attnplan::plan {

void encode_tensor_map(TensorMap& map, CUtensorMapDataType type, int element_bytes, const void* base,
                       long long columns, long long rows, long long row_stride, int box_columns, int box_rows,
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

void encode_gemm_c_map(TensorMap& map, const GemmParams& params) {
  encode_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, params.c, params.n, params.m, params.ldc,
                    kGemmSm90StoreBox, kGemmSm90StoreBox, "gemm c");
}

}  // namespace attnplan::plan
