#include "plan/gemm_common.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "core/error.hpp"

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

}  // namespace attnplan::plan
