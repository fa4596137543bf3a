// What the projection GEMM kernels share on the host (gemm_spec.hpp: bf16 and weight-only formats;
// gemm_fp8.hpp: fp8 activations): the checks of a GemmParams every kernel needs, and the TMA tensor
// maps of the sm_90a kernels. Each spec adds its own rules on top.
#pragma once

#include <cuda.h>

#include <functional>
#include <string_view>

#include "attnplan/gemm_params.h"
#include "attnplan/tensor_map.h"

namespace attnplan::plan {

// Throws Error(input) "`kernel`: ..." naming the field when `params` breaks what every projection GEMM
// demands: negative sizes; then (when M and N are > 0) lda < K, ldc < N or either not a multiple of 8;
// null or non-16-byte-aligned A, C or weights; `segments` outside [1, kMaxGemmSegments]; segments that do
// not tile [0, N) in order with non-empty pieces; a bias on a spec without bias or one not 2-byte
// aligned. `segment_rules` (may be empty) adds a spec's own checks of each segment, in the same walk.
// Returns false when M or N is 0: nothing more to check and nothing to launch.
bool check_gemm_operands(
    const GemmParams& params, int segments, bool has_bias, std::string_view kernel,
    const std::function<void(int index, const GemmSegment& segment)>& segment_rules = {});

// A 2D TMA map of a row-major matrix [rows, columns] of `element_bytes`-byte elements of `type` (row
// stride in elements), read in boxes of [box_rows, box_columns] into shared memory with `swizzle` (128-byte
// by default: the wgmma operands; the 4-bit codes of wgmma_w4 load unswizzled);
// out-of-bounds elements load as zeros. A host-only driver call: no allocation, no synchronization, so
// legal per launch and during stream capture. `what` names the operand in the driver error.
void encode_tensor_map(TensorMap& map, CUtensorMapDataType type, int element_bytes, const void* base,
                       int columns, int rows, long long row_stride, int box_columns, int box_rows,
                       std::string_view what, CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B);

}  // namespace attnplan::plan
