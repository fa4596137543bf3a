// TMA tensor maps on the host: what the sm_90a kernels (projection GEMMs, attention with kv_tma) read
// their tiles through. Encoded per launch (a host-only driver call).
#pragma once

#include <cuda.h>

#include <string_view>

#include "attnplan/gemm_params.h"
#include "attnplan/tensor_map.h"

namespace attnplan::plan {

// A 2D TMA map of a row-major matrix [rows, columns] of `element_bytes`-byte elements of `type` (row
// stride in elements), read in boxes of [box_rows, box_columns] into shared memory with `swizzle` (128-byte
// by default: the wgmma operands; the 4-bit codes of wgmma_w4 load unswizzled);
// out-of-bounds elements load as zeros. A host-only driver call: no allocation, no synchronization, so
// legal per launch and during stream capture. `what` names the operand in the driver error.
void encode_tensor_map(TensorMap& map, CUtensorMapDataType type, int element_bytes, const void* base,
                       long long columns, long long rows, long long row_stride, int box_columns, int box_rows,
                       std::string_view what, CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B);

// The map the sm_90a GEMMs' epilogue stores C through (gemm_sm90_epilogue.cuh): C [M, N] bf16, row stride
// ldc, boxes of [64, 64] with 128-byte swizzle; the TMA store clips rows past M and columns past N.
// check_gemm_operands has made C 16-byte aligned and ldc a multiple of 8, as TMA needs.
void encode_gemm_c_map(TensorMap& map, const GemmParams& params);

}  // namespace attnplan::plan
