// The pair decode of the E2M1 and e4m3fn weight policies (gemm.cuh `dequantize`: two codes per code_pair,
// then the scale), which the mma.sync loaders and the dequantize kernel run, against the scalar decode it
// replaced (e2m1_to_float / e4m3fn_to_float times the scale), bit for bit and exhaustively: every code
// byte in every byte position, every E8M0 and e4m3fn scale byte, and f32 scales at the edges (subnormal,
// the 2^14 fold's overflow bound, infinite, NaN). Both decodes run on the device in one test kernel, a
// header handed to NVRTC beside the runtime's templates. NaN matches any NaN (the formats carry no
// payload), every other value its exact bits.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "compiler/compiler.hpp"
#include "driver/launch.hpp"
#include "driver/memory.hpp"
#include "driver/module.hpp"
#include "driver/stream.hpp"
#include "gpu_support.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::gpu_testing;

namespace {

constexpr int kThreads = 256;  // thread t decodes bytes t, t + 1, ... (mod 256): every byte in every position

// grid: [rows, scale_2 candidates], block: [256]. Row r's scale is its group 0 scale (E8M0 / e4m3fn byte r,
// or fp8 per-channel f32 r); block y gives nvfp4 scale_2[y].
constexpr const char* kCheckHeader = R"(#pragma once
#include "attnplan/gemm.cuh"

namespace attnplan_test {

struct PairDecodeParams {
  attnplan::GemmSegment segment;  // scales of the rows, one group each; weight is not read
  const float* scale_2;           // [gridDim.y] (nvfp4)
  int k_total;                    // one group: 32 (MX), 16 (nvfp4), any (fp8 per channel)
  unsigned* mismatches;           // [gridDim.y, rows, 256]: bit e set where value e differs
};

template <class Weights>
struct PairDecodeTraits {
  using Params = PairDecodeParams;
  using Policy = Weights;
};

template <class Traits>
__global__ void pair_decode_check_kernel(const PairDecodeParams params) {
  using Weights = typename Traits::Policy;
  __shared__ __align__(16) unsigned char codes[256 * 8];
  unsigned char* raw = codes + threadIdx.x * 8;
  for (int e = 0; e < 8; ++e) raw[e] = static_cast<unsigned char>(threadIdx.x + e);
  attnplan::GemmSegment segment = params.segment;
  segment.scale_2 = params.scale_2 + blockIdx.y;
  const int row = blockIdx.x;

  float got[8];
  Weights::dequantize(raw, segment, row, /*k=*/0, params.k_total, got);
  // The scalar decode as gemm.cuh had it before the pair decode.
  const float s = Weights::group_scale(segment, row, /*group=*/0, params.k_total);
  float expected[8];
  if constexpr (Weights::bits == 4) {
    for (int e = 0; e < 4; ++e) {
      expected[2 * e] = attnplan::kernels::e2m1_to_float(raw[e] & 15u) * s;
      expected[2 * e + 1] = attnplan::kernels::e2m1_to_float(raw[e] >> 4) * s;
    }
  } else {
    for (int e = 0; e < 8; ++e) expected[e] = attnplan::kernels::e4m3fn_to_float(raw[e]) * s;
  }
  unsigned mask = 0;
  for (int e = 0; e < 8; ++e) {
    const bool both_nan = got[e] != got[e] && expected[e] != expected[e];
    const bool same = __float_as_uint(got[e]) == __float_as_uint(expected[e]) || both_nan;
    if (!same) mask |= 1u << e;
  }
  params.mismatches[(blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x] = mask;
}

}  // namespace attnplan_test
)";

// The check header's PairDecodeParams, field for field (the header exists only as NVRTC input).
struct PairDecodeParams {
  GemmSegment segment;
  const float* scale_2;
  int k_total;
  unsigned* mismatches;
};

struct CheckKernel {
  driver::Module module;
  driver::Function function;
};

// The check kernel for `policy` (a gemm.cuh weight policy), compiled for the device with the runtime's
// templates (ATTNPLAN_TEMPLATE_DIR's when set) plus the check header.
CheckKernel check_kernel(const std::string& policy) {
  std::map<std::string, std::string> headers = gpu().runtime.compiler().templates().headers();
  headers["attnplan_test/pair_decode_check.cuh"] = kCheckHeader;
  const compiler::Compiler compiler(gpu().runtime.compiler().toolkit(),
                                    compiler::TemplateLibrary::from_headers(headers, "pair decode test"));
  compiler::KernelSource source;
  source.family = "pair_decode_check";
  source.header = "attnplan_test/pair_decode_check.cuh";
  source.traits = "attnplan_test::PairDecodeTraits";
  source.kernel = "attnplan_test::pair_decode_check_kernel";
  source.arguments = {{"weights", policy}};
  source.spec = {{"kind", "pair_decode_check"}, {"weights", policy}};
  const compiler::CompiledKernel kernel =
      compiler.compile(source, gpu().runtime.compile_options(device_arch()));
  driver::Module module = driver::Module::load(kernel.cubin);
  driver::Function function = module.function(kernel.lowered_name);
  return {std::move(module), function};
}

// Runs `policy`'s check over `rows` rows of `scales` (the segment's scale tensor, one group per row) and
// each of `scale_2`; fails with the first differing (scale_2, row, code bytes, value) named.
void check_policy(const std::string& policy, const driver::DeviceBuffer& scales, int rows, int k_total,
                  const std::vector<float>& scale_2) {
  gpu().context.make_current();
  INFO(policy);
  const CheckKernel kernel = check_kernel(policy);
  const driver::DeviceBuffer d_scale_2 = driver::DeviceBuffer::from_host(scale_2);
  driver::DeviceBuffer d_mismatches(std::size_t(scale_2.size()) * rows * kThreads * sizeof(unsigned));
  const PairDecodeParams params{GemmSegment{nullptr, nullptr, 0, rows, scales.data<const void>(), nullptr},
                                d_scale_2.data<const float>(), k_total, d_mismatches.data<unsigned>()};
  gpu().context.synchronize();  // the uploads
  driver::Stream stream = driver::Stream::create();
  driver::launch(kernel.function,
                 driver::LaunchShape{{unsigned(rows), unsigned(scale_2.size()), 1}, {kThreads, 1, 1}, 0},
                 stream.handle(), params);
  stream.synchronize();
  const std::vector<unsigned> mismatches = d_mismatches.download_all<unsigned>();
  std::size_t differing = 0;
  for (std::size_t i = 0; i < mismatches.size(); ++i) {
    if (mismatches[i] == 0) continue;
    if (differing++ == 0) {
      const std::size_t thread = i % kThreads;
      UNSCOPED_INFO("first difference: scale_2[" << i / kThreads / rows << "], row " << i / kThreads % rows
                                                 << ", code bytes from " << thread << ", value mask "
                                                 << mismatches[i]);
    }
  }
  std::printf("pair decode %-40s %zu x %d x %d decodes of 8, %zu differ\n", policy.c_str(), scale_2.size(),
              rows, kThreads, differing);
  CHECK(differing == 0);
}

std::vector<std::uint8_t> every_byte() {
  std::vector<std::uint8_t> bytes(256);
  for (int b = 0; b < 256; ++b) bytes[b] = std::uint8_t(b);
  return bytes;
}

}  // namespace

TEST_CASE("the pair decodes give the scalar decode's values for every code and scale", "[gpu][pair_decode]") {
  gpu().context.make_current();  // the scale buffers below live in the device's primary context
  const driver::DeviceBuffer byte_scales = driver::DeviceBuffer::from_host(every_byte());
  // E8M0 scales: every exponent, 2^-127 (subnormal) to 2^127 and NaN, 241 and up past the 2^14 fold's bound.
  check_policy("attnplan::kernels::Mxfp4Weights", byte_scales, 256, 32, {1.0f});
  check_policy("attnplan::kernels::Mxfp8Weights", byte_scales, 256, 32, {1.0f});
  // nvfp4: every e4m3fn scale times per-tensor scales from subnormal to past the fold's bound (2^110 x
  // 448 > 2^113), infinite and NaN, with odd mantissas so that the products round.
  const float infinity = std::numeric_limits<float>::infinity();
  check_policy("attnplan::kernels::Nvfp4Weights", byte_scales, 256, 16,
               {1.0f, 3.7e-5f, 1.1e-40f, 0x1.6p-120f, 0x1.9p+100f, 0x1p+110f, 0x1.3p+112f, 3.4e38f, infinity,
                std::numeric_limits<float>::quiet_NaN(), -0.7f});
  // fp8 per channel: one f32 scale per row, the same edges plus every binade and a few mantissas.
  std::vector<float> f32_scales = {0.0f,
                                   -0.0f,
                                   1.4e-45f,
                                   1.1e-40f,
                                   0x1p-126f,
                                   1.0f,
                                   -2.75f,
                                   0x1.fffffep+127f,
                                   infinity,
                                   -infinity,
                                   std::numeric_limits<float>::quiet_NaN()};
  for (int exponent = -149; exponent <= 127; ++exponent) f32_scales.push_back(std::ldexp(1.2345f, exponent));
  const driver::DeviceBuffer channel_scales = driver::DeviceBuffer::from_host(f32_scales);
  check_policy("attnplan::kernels::Fp8Weights<1>", channel_scales, int(f32_scales.size()), 128, {1.0f});
}
