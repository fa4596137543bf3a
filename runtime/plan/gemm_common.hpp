// What the projection GEMM kernels share on the host (gemm_spec.hpp: bf16 and weight-only formats;
// gemm_fp8.hpp: fp8 activations): the checks of a GemmParams every kernel needs. Each spec adds its own
// rules on top.
#pragma once

#include <functional>
#include <string_view>

#include "attnplan/gemm_params.h"

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

}  // namespace attnplan::plan
