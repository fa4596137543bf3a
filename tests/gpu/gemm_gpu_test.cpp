// The bf16 projection GEMM against the double-precision reference (reference::linear on the same bf16
// inputs): every mma.sync tiling the heuristic can pick and, on sm_90a, both wgmma tilings the segments
// allow (plus whatever choose_gemm_kernel picks), segmented and fused weights, with and without bias, odd
// M / N / K, strided A and C. Then the throughput of prefill-sized products ([.benchmark], [.gemm_speed]).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "core/bf16.hpp"
#include "driver/device.hpp"
#include "driver/event.hpp"
#include "driver/launch.hpp"
#include "driver/memory.hpp"
#include "driver/module.hpp"
#include "driver/stream.hpp"
#include "gpu_support.hpp"
#include "io/random_projection.hpp"
#include "plan/gemm_spec.hpp"
#include "reference/bf16.hpp"
#include "reference/compare.hpp"
#include "reference/dequantize.hpp"
#include "reference/layer.hpp"
#include "support/catch.hpp"
#include "support/weight_encodings.hpp"

using namespace attnplan;
using namespace attnplan::gpu_testing;

namespace {

// The heuristic's three candidates, then two alternatives it was fitted against (a deeper-K 128x128, and
// 64x128 with block_k 32), timed alongside. All are checked for correctness: the template is generic.
const plan::GemmTiling kTilings[] = {
    {.block_m = 128, .block_n = 128, .block_k = 32, .warps_m = 2, .warps_n = 4, .stages = 4},
    {.block_m = 64, .block_n = 128, .block_k = 64, .warps_m = 2, .warps_n = 2, .stages = 3},
    {.block_m = 64, .block_n = 64, .block_k = 64, .warps_m = 2, .warps_n = 2, .stages = 4},
    {.block_m = 128, .block_n = 128, .block_k = 64, .warps_m = 2, .warps_n = 4, .stages = 3},
    {.block_m = 64, .block_n = 128, .block_k = 32, .warps_m = 2, .warps_n = 2, .stages = 4},
};

std::string tiling_name(const plan::GemmTiling& t) {
  return std::to_string(t.block_m) + "x" + std::to_string(t.block_n) + "x" + std::to_string(t.block_k) + "/" +
         std::to_string(t.stages);
}

// "128x128x32/4" for mma.sync, "wgmma 128x256x64/4", "wgmma_w4 256x128x64/6" and "wgmma_decode
// 128x192x64/4+4" for the sm_90a kernels.
std::string spec_name(const plan::GemmSpec& spec) {
  if (spec.kernel == plan::GemmKernel::mma_sync) return tiling_name(spec.tiling);
  if (spec.kernel == plan::GemmKernel::wgmma_w4)  // tokens x weight rows
    return "wgmma_w4 " + std::to_string(spec.sm90.block_n) + "x128x64/" + std::to_string(spec.sm90.stages);
  if (spec.kernel == plan::GemmKernel::wgmma_decode)  // ring slots + code slots
    return "wgmma_decode 128x" + std::to_string(spec.sm90.block_n) + "x64/" +
           std::to_string(spec.sm90.stages) + "+" + std::to_string(spec.sm90.code_stages) +
           (spec.sm90.cluster_m > 1 ? " x" + std::to_string(spec.sm90.cluster_m) : "");
  return "wgmma 128x" + std::to_string(spec.sm90.block_n) + "x64/" + std::to_string(spec.sm90.stages) +
         (spec.sm90.cluster_m > 1 ? " x" + std::to_string(spec.sm90.cluster_m) : "");
}

// The wgmma tilings the tests run, each without and with clusters of 2 (160 only alone: a CTA's half of
// its W slice, 80 rows, is not whole 32-row pieces).
const plan::GemmSm90Tiling kSm90Tilings[] = {{256, 4}, {256, 4, 2}, {192, 4},   {192, 4, 2},
                                             {160, 5}, {128, 6},    {128, 6, 2}};

// The specs a case runs: every mma.sync tiling; on sm_90a also the wgmma tilings the segments allow and
// the heuristic's own pick.
std::vector<plan::GemmSpec> specs_for(int segments, bool has_bias, const std::vector<int>& widths, int m,
                                      int k) {
  std::vector<plan::GemmSpec> specs;
  for (const plan::GemmTiling& tiling : kTilings) specs.push_back({segments, has_bias, tiling});
  const config::Arch arch = device_arch();
  if (arch.sm() == 90 && arch.arch_specific) {
    for (const plan::GemmSm90Tiling& tiling : kSm90Tilings) {
      if (plan::gemm_sm90_segments_fit(widths, tiling.block_n))
        specs.push_back({segments, has_bias, kTilings[0], plan::GemmKernel::wgmma, tiling});
    }
  }
  const int n = std::accumulate(widths.begin(), widths.end(), 0);
  const plan::GemmKernelChoice choice = plan::choose_gemm_kernel(arch, m, n, k, widths);
  plan::GemmSpec picked{segments, has_bias, plan::choose_gemm_tiling(m, n, k, arch), choice.kernel,
                        choice.sm90};
  specs.push_back(picked);
  return specs;
}

const driver::Function& gemm_function(const plan::GemmSpec& spec) {
  return kernel_function(spec.source(), spec.dynamic_shared_bytes());
}

struct Case {
  std::string name;
  int m;
  int k;
  std::vector<int> segment_widths;  // N split into weight segments (1 to 3)
  bool has_bias;
  int lda_padding = 0;              // A's row stride is k + lda_padding (padding columns hold NaN)
  int ldc_padding = 8;              // C's row stride is n + ldc_padding (guard columns must stay poisoned)
  bool middle_bias_absent = false;  // segment 1 has no bias pointer (reads as zeros)
};

void check_gemm(const Case& c, std::uint64_t seed) {
  gpu().context.make_current();  // the buffers below are allocated in the device's primary context
  const int n = std::accumulate(c.segment_widths.begin(), c.segment_widths.end(), 0);
  const long long lda = c.k + c.lda_padding;
  const long long ldc = n + c.ldc_padding;
  std::mt19937_64 rng(seed);

  // Activations with a non-zero mean; weights scaled so that outputs are O(1); biases of a similar size.
  std::vector<std::uint16_t> a_bits(std::size_t(c.m) * lda, kPoisonBits);  // [M, lda], NaN padding
  const std::vector<std::uint16_t> a_values = random_bf16(std::size_t(c.m) * c.k, rng, 0.1, 1.0);
  for (int row = 0; row < c.m; ++row)
    std::copy_n(a_values.begin() + std::ptrdiff_t(row) * c.k, c.k,
                a_bits.begin() + std::ptrdiff_t(row * lda));
  const std::vector<std::uint16_t> w_bits = random_bf16(std::size_t(n) * c.k, rng, 0.0, 1.0 / std::sqrt(c.k));
  const std::vector<std::uint16_t> bias_bits = random_bf16(n, rng, 0.0, 0.5);

  driver::DeviceBuffer d_a = upload_with_nan_tail(a_bits, lda);  // plus one NaN row past M
  std::vector<driver::DeviceBuffer> d_weights, d_biases;
  plan::GemmSpec spec;
  spec.segments = int(c.segment_widths.size());
  spec.has_bias = c.has_bias;
  GemmParams params{};
  std::vector<double> reference_bias;
  if (c.has_bias) reference_bias.assign(n, 0.0);
  int n_begin = 0;
  for (std::size_t s = 0; s < c.segment_widths.size(); ++s) {
    const int width = c.segment_widths[s];
    const auto first = w_bits.begin() + std::ptrdiff_t(n_begin) * c.k;
    d_weights.push_back(upload_with_nan_tail({first, first + std::ptrdiff_t(width) * c.k}, c.k));
    params.segments[s] = {d_weights.back().data<const bf16_bits>(), nullptr, n_begin, n_begin + width};
    if (c.has_bias && !(c.middle_bias_absent && s == 1)) {
      d_biases.push_back(
          upload_with_nan_tail({bias_bits.begin() + n_begin, bias_bits.begin() + n_begin + width}, 8));
      params.segments[s].bias = d_biases.back().data<const bf16_bits>();
      for (int j = n_begin; j < n_begin + width; ++j) reference_bias[j] = core::bf16_to_float(bias_bits[j]);
    }
    n_begin += width;
  }
  // One guard row past M and guard columns [N, ldc): all must stay poisoned.
  driver::DeviceBuffer d_c(std::size_t(c.m + 1) * ldc * 2);
  params.a = d_a.data<const bf16_bits>();
  params.c = d_c.data<bf16_bits>();
  params.m = c.m;
  params.n = n;
  params.k = c.k;
  params.lda = lda;
  params.ldc = ldc;

  const reference::Tensor expected =
      reference::linear(reference::tensor_from_bf16(a_values, {c.m, c.k}),
                        reference::tensor_from_bf16(w_bits, {n, c.k}), reference_bias);
  driver::Stream stream = driver::Stream::create();
  gpu().context.synchronize();  // uploads from pageable memory may still be in flight on the legacy stream
  for (const plan::GemmSpec& each : specs_for(spec.segments, spec.has_bias, c.segment_widths, c.m, c.k)) {
    spec = each;
    INFO(c.name << ": M " << c.m << " N " << n << " K " << c.k << " segments " << spec.segments << " bias "
                << c.has_bias << " kernel " << spec_name(spec));
    spec.check(params);
    const driver::Function& function = gemm_function(spec);
    d_c.fill_bytes_async(kPoisonByte, stream.handle());
    plan::launch_gemm(function, spec, params, stream.handle(), device_multiprocessors());
    stream.synchronize();
    const std::vector<std::uint16_t> output = d_c.download_all<std::uint16_t>();

    const std::vector<double> got = checked_output(output, c.m, n, ldc);
    const double error = reference::relative_l2_error(expected.data, got);
    std::printf("gemm %-12s M %5d N %5d K %5d segments %d bias %d kernel %-18s relative L2 error %.3e\n",
                c.name.c_str(), c.m, n, c.k, spec.segments, int(c.has_bias), spec_name(spec).c_str(), error);
    INFO("relative L2 error " << error);
    // bf16 operands are exact in the reference; what remains is fp32 accumulation and one bf16 rounding.
    CHECK(error < 1e-2);
  }
}

}  // namespace

TEST_CASE("projection GEMM matches the reference", "[gpu][gemm]") {
  const std::vector<Case> cases = {
      {"llama qkv", 300, 4096, {4096, 1024, 1024}, false},
      {"qwen qkv", 300, 4096, {4096, 1024, 1024}, true, 8, 24},
      {"llama o", 300, 4096, {4096}, false},
      {"o bias", 300, 4096, {4096}, true, 0, 16},
      {"one token", 1, 2880, {120, 40, 40}, true},
      {"37 tokens", 37, 2880, {120, 40, 40}, false, 16, 8},
      {"K 72", 37, 72, {120, 40, 40}, true, 0, 8, true},
      {"K 72 fused", 1, 72, {200}, false},
      {"odd M", 131, 2880, {120, 40, 40}, true, 8, 40, true},
      {"K tail", 200, 1000, {264, 136}, true},  // K not a multiple of any block_k
      // For the wgmma kernel (sm_90a): M, N, K no tile multiple, 3 segments, bias, strided A and C.
      {"sm90 ragged", 333, 4104, {512, 256, 200}, true, 8, 24, true},
      {"sm90 narrow", 259, 1032, {384, 128, 72}, true, 0, 8},  // 128-wide tiles fit, 192 straddle
      // Boundaries at multiples of 32, not 64: only 192-wide tiles (straddling, in 32-row W pieces) fit.
      {"sm90 pieces", 200, 264, {160, 96, 200}, true, 0, 8, true},
      {"gpt-oss qkv", 512, 2880, {4096, 512, 512}, true},  // 27 tiles of 192 per row, q | k inside one
      {"sm90 many", 1500, 1024, {2048, 512, 512}, true},   // 144 tiles: some CTAs take two
      {"sm90 K 8", 130, 8, {256, 256, 8}, false, 8, 8},    // one partial K slice
      {"sm90 one row", 1, 64, {256}, true},
      // 11 row tiles (a cluster's second tile past M) and more tile pairs than clusters.
      {"sm90 odd pairs", 1400, 512, {2048, 1024, 1024}, true, 0, 8},
  };
  std::uint64_t seed = 4242;
  for (const Case& c : cases) check_gemm(c, seed++);
}

namespace {

// "gptq_v2 4-bit g128 act_order", "affine 3-bit g32", "mxfp4", "fp8 block"
std::string encoding_name(const config::WeightEncoding& weights) {
  switch (weights.format) {
    case config::WeightFormat::packed_integer:
      return std::string(config::to_string(weights.scheme)) + " " + std::to_string(weights.bits) + "-bit g" +
             std::to_string(weights.group_size) + (weights.act_order ? " act_order" : "");
    case config::WeightFormat::affine:
      return "affine " + std::to_string(weights.bits) + "-bit g" + std::to_string(weights.group_size);
    case config::WeightFormat::fp8:
      return "fp8 " + std::string(config::to_string(weights.scale_granularity));
    default:
      return std::string(config::to_string(weights.format));
  }
}

// The encodings of `list` named `names` (encoding_name), in that order: a list reordered or grown keeps each
// test's picks, and a name it lacks fails the test.
std::vector<config::WeightEncoding> named_encodings(const std::vector<config::WeightEncoding>& list,
                                                    std::initializer_list<std::string_view> names) {
  std::vector<config::WeightEncoding> picked;
  for (const std::string_view name : names) {
    const auto found = std::find_if(list.begin(), list.end(), [&](const config::WeightEncoding& each) {
      return encoding_name(each) == name;
    });
    INFO("encoding " << name);
    REQUIRE(found != list.end());
    picked.push_back(*found);
  }
  return picked;
}

// Params of C [m, n] (row stride ldc) = A [m, k] (row stride k) x W^T; the segments are the caller's.
GemmParams dense_gemm_params(const driver::DeviceBuffer& a, driver::DeviceBuffer& c, int m, int n, int k,
                             long long ldc) {
  GemmParams params{};
  params.a = a.data<const bf16_bits>();
  params.c = c.data<bf16_bits>();
  params.m = m;
  params.n = n;
  params.k = k;
  params.lda = k;
  params.ldc = ldc;
  return params;
}

// A quantized W in segments on the device (gpu_support's upload_quantized_segments) with its segment
// table, ready to copy into any GemmParams.
struct QuantizedWeights {
  QuantizedSegments data;  // buffers, and the dequantized W and bias the reference uses
  GemmSegment segments[kMaxGemmSegments] = {};
};

QuantizedWeights upload_quantized(const config::WeightEncoding& weights, int k,
                                  const std::vector<int>& widths, const std::vector<std::uint16_t>& bias_bits,
                                  std::uint64_t seed) {
  QuantizedWeights result;
  GemmParams params{};
  result.data = upload_quantized_segments(weights, k, widths, bias_bits, seed, params);
  std::copy(std::begin(params.segments), std::end(params.segments), std::begin(result.segments));
  return result;
}

// A quantized projection problem on the device: random A [m, k] (a NaN row past M), W in `widths`
// segments with their biases, C [m + 1, n + 8] (a guard row and guard columns), the Params over them and
// reference::linear over reference::dequantize of the same bytes.
struct QuantizedProblem {
  int n = 0;
  long long ldc = 0;
  driver::DeviceBuffer a;
  QuantizedWeights w;
  driver::DeviceBuffer c;
  GemmParams params{};
  reference::Tensor expected;
};

QuantizedProblem quantized_problem(const config::WeightEncoding& weights, int m, int k,
                                   const std::vector<int>& widths, bool has_bias, std::uint64_t seed) {
  QuantizedProblem problem;
  problem.n = std::accumulate(widths.begin(), widths.end(), 0);
  problem.ldc = problem.n + 8;
  std::mt19937_64 rng(seed);
  const std::vector<std::uint16_t> a_values = random_bf16(std::size_t(m) * k, rng, 0.1, 1.0);
  const std::vector<std::uint16_t> bias_bits =
      has_bias ? random_bf16(problem.n, rng, 0.0, 0.5) : std::vector<std::uint16_t>{};
  problem.a = upload_with_nan_tail(a_values, k);
  problem.w = upload_quantized(weights, k, widths, bias_bits, seed);
  problem.c = driver::DeviceBuffer(std::size_t(m + 1) * problem.ldc * 2);
  problem.params = dense_gemm_params(problem.a, problem.c, m, problem.n, k, problem.ldc);
  std::copy(std::begin(problem.w.segments), std::end(problem.w.segments),
            std::begin(problem.params.segments));
  problem.expected = reference::linear(reference::tensor_from_bf16(a_values, {m, k}), problem.w.data.weight,
                                       problem.w.data.bias);
  return problem;
}

// A quantized W against reference::linear over reference::dequantize of the same bytes: every mma.sync
// tiling, or the given tilings of an sm_90a kernel (wgmma_w4 or wgmma_decode); poisoned C with guard
// columns.
void check_quantized_gemm(const config::WeightEncoding& weights, int m, int k, const std::vector<int>& widths,
                          bool has_bias, std::uint64_t seed,
                          const std::vector<plan::GemmSm90Tiling>& sm90_tilings = {},
                          plan::GemmKernel sm90_kernel = plan::GemmKernel::wgmma_w4) {
  gpu().context.make_current();
  QuantizedProblem problem = quantized_problem(weights, m, k, widths, has_bias, seed);
  const int n = problem.n;
  driver::DeviceBuffer& d_c = problem.c;
  const GemmParams& params = problem.params;

  plan::GemmSpec spec;
  spec.segments = int(widths.size());
  spec.has_bias = has_bias;
  spec.weights = weights;
  std::vector<plan::GemmSpec> kernels;
  if (!sm90_tilings.empty()) {
    for (const plan::GemmSm90Tiling& tiling : sm90_tilings) {
      spec.kernel = sm90_kernel;
      spec.sm90 = tiling;
      kernels.push_back(spec);
    }
  } else {
    for (const plan::GemmTiling& tiling : kTilings) {
      spec.tiling = tiling;
      kernels.push_back(spec);
    }
  }
  driver::Stream stream = driver::Stream::create();
  gpu().context.synchronize();
  for (const plan::GemmSpec& each : kernels) {
    INFO(encoding_name(weights) << ": M " << m << " N " << n << " K " << k << " kernel " << spec_name(each));
    each.check(params);
    const driver::Function& function = gemm_function(each);
    d_c.fill_bytes_async(kPoisonByte, stream.handle());
    plan::launch_gemm(function, each, params, stream.handle(), device_multiprocessors());
    stream.synchronize();
    const std::vector<std::uint16_t> output = d_c.download_all<std::uint16_t>();
    const std::vector<double> got = checked_output(output, m, n, problem.ldc);
    const double error = reference::relative_l2_error(problem.expected.data, got);
    std::printf("quantized gemm %-28s M %5d N %5d K %5d kernel %-22s relative L2 error %.3e\n",
                encoding_name(weights).c_str(), m, n, k, spec_name(each).c_str(), error);
    INFO("relative L2 error " << error);
    // W rounds once to bf16 (reference: exact); fp32 accumulation; one output rounding.
    CHECK(error < 1e-2);
  }
}

}  // namespace

TEST_CASE("quantized projection GEMM matches the reference per format", "[gpu][gemm][quantized]") {
  std::vector<config::WeightEncoding> encodings;
  for (auto granularity : {config::Fp8ScaleGranularity::tensor, config::Fp8ScaleGranularity::channel,
                           config::Fp8ScaleGranularity::block}) {
    config::WeightEncoding fp8;
    fp8.format = config::WeightFormat::fp8;
    fp8.scale_granularity = granularity;
    encodings.push_back(fp8);
  }
  for (auto format :
       {config::WeightFormat::mxfp8, config::WeightFormat::mxfp4, config::WeightFormat::nvfp4}) {
    config::WeightEncoding encoding;
    encoding.format = format;
    encodings.push_back(encoding);
  }
  std::uint64_t seed = 777;
  for (const auto& weights : encodings) {
    // No tile multiples: M 37 and 300, N segments of 120/40/40, K 2880 (gpt-oss; 22.5 blocks of 128).
    check_quantized_gemm(weights, 37, 2880, {120, 40, 40}, true, seed++);
    check_quantized_gemm(weights, 300, 4096, {4096, 1024, 1024}, false, seed++);
    check_quantized_gemm(weights, 1, 2880, {200}, true, seed++);
  }
}

namespace {

// The dequantized path (dequantize.cuh, then the bf16 wgmma GEMM): W [N, K] bf16 from the dequantize kernel
// against reference::dequantize of the same bytes (every element written, the guard row untouched), then
// the GEMM over it against reference::linear, as the plan launches them.
void check_dequantized_gemm(const config::WeightEncoding& weights, int m, int k,
                            const std::vector<int>& widths, bool has_bias, std::uint64_t seed) {
  gpu().context.make_current();
  const config::Arch arch = device_arch();
  QuantizedProblem problem = quantized_problem(weights, m, k, widths, has_bias, seed);
  const int n = problem.n;
  driver::DeviceBuffer& d_c = problem.c;
  driver::DeviceBuffer d_w(std::size_t(n + 1) * k * 2);  // W [N, K] and a guard row

  plan::GemmSpec quantized;
  quantized.segments = int(widths.size());
  quantized.has_bias = has_bias;
  quantized.weights = weights;
  const std::optional<plan::GemmSpec> gemm = plan::choose_dequantized_gemm(quantized, arch, m, n, k, widths);
  REQUIRE(gemm);
  const plan::DequantizeSpec dequantize = plan::choose_dequantize(quantized.segments, weights, k, widths);
  const DequantizeParams params{problem.params, d_w.data<bf16_bits>()};
  dequantize.check(params);
  const GemmParams bf16 = plan::dequantized_gemm_params(params.gemm, params.weight);
  gemm->check(bf16);

  driver::Stream stream = driver::Stream::create();
  gpu().context.synchronize();
  INFO(encoding_name(weights) << ": M " << m << " N " << n << " K " << k);
  d_w.fill_bytes_async(kPoisonByte, stream.handle());
  d_c.fill_bytes_async(kPoisonByte, stream.handle());
  plan::launch_dequantize(kernel_function(dequantize.source(), dequantize.dynamic_shared_bytes()), dequantize,
                          params, stream.handle());
  stream.synchronize();
  const std::vector<double> got_w = checked_output(d_w.download_all<std::uint16_t>(), n, k, k);
  const double w_error = reference::relative_l2_error(problem.w.data.weight.data, got_w);
  plan::launch_gemm(gemm_function(*gemm), *gemm, bf16, stream.handle(), device_multiprocessors());
  stream.synchronize();
  const std::vector<double> got = checked_output(d_c.download_all<std::uint16_t>(), m, n, problem.ldc);
  const double error = reference::relative_l2_error(problem.expected.data, got);
  const char* kernel = dequantize.kernel == plan::DequantizeKernel::group_table ? "group table" : "tiles";
  std::printf("dequantized %-28s M %5d N %5d K %5d (%s): W relative L2 %.3e, GEMM (%s) relative L2 %.3e\n",
              encoding_name(weights).c_str(), m, n, k, kernel, w_error, spec_name(*gemm).c_str(), error);
  INFO("W relative L2 error " << w_error << ", GEMM relative L2 error " << error);
  // W rounds once to bf16 (at most 2^-9 relative per element); then fp32 accumulation and one rounding.
  CHECK(w_error < 4e-3);
  CHECK(error < 1e-2);
}

}  // namespace

TEST_CASE("the dequantized path matches the reference per format", "[gpu][gemm][dequantized]") {
  const config::Arch arch = device_arch();
  if (arch.sm() != 90 || !arch.arch_specific) {
    WARN("the dequantized path's GEMM is the sm_90a wgmma kernel; " << arch.name() << " skips it");
    return;
  }
  const auto packed = testing::packed_encoding;
  using config::PackedIntegerScheme;
  std::vector<config::WeightEncoding> encodings = testing::sm90_w8_encodings();  // fp8 x 3, mxfp8
  for (auto format : {config::WeightFormat::mxfp4, config::WeightFormat::nvfp4}) {
    config::WeightEncoding e4m1;
    e4m1.format = format;
    encodings.push_back(e4m1);
  }
  for (const config::WeightEncoding& each :
       {packed(PackedIntegerScheme::gptq, 4, 128, false), packed(PackedIntegerScheme::gptq, 4, 128, true),
        packed(PackedIntegerScheme::gptq_v2, 8, 32, true), packed(PackedIntegerScheme::awq, 4, 128, false),
        packed(PackedIntegerScheme::awq, 4, -1, false), testing::affine_encoding(4, 64),
        testing::affine_encoding(3, 32)})
    encodings.push_back(each);
  std::uint64_t seed = 9400;
  for (const config::WeightEncoding& weights : encodings) {
    // M 1100 (no tile multiple), a q | k | v split whose last segment is ragged (1024 | 256 | 200), K with
    // a half 64-wide tile where the group allows it (2912 = 45.5 x 64; groups of 64: 2880, of 128: 2944).
    const int k = weights.group_size == 128 ? 2944 : (weights.group_size == 64 ? 2880 : 2912);
    check_dequantized_gemm(weights, 1100, k, {1024, 256, 200}, true, seed++);
    check_dequantized_gemm(weights, plan::dequantized_min_tokens(weights), 4096, {4096}, false, seed++);
    if (weights.act_order) {
      // The group table above (segments of whole 64-row blocks); segments of 992 | 224 rows (whole 32-row
      // pieces for the wgmma GEMM) take the tiles kernel, whose gathers stay for such shapes and for K of
      // more than 192 groups.
      REQUIRE(plan::choose_dequantize(3, weights, k, std::vector<int>{992, 224, 200}).kernel ==
              plan::DequantizeKernel::tiles);
      check_dequantized_gemm(weights, 600, k, {992, 224, 200}, false, seed++);
    }
  }
}

TEST_CASE("packed integer and affine projection GEMMs match the reference",
          "[gpu][gemm][quantized][integer]") {
  const auto packed = testing::packed_encoding;
  const auto affine = testing::affine_encoding;
  using config::PackedIntegerScheme;
  const config::WeightEncoding encodings[] = {
      packed(PackedIntegerScheme::gptq, 4, 128, false),
      packed(PackedIntegerScheme::gptq, 4, 128, true),
      packed(PackedIntegerScheme::gptq_v2, 4, 32, false),
      packed(PackedIntegerScheme::gptq, 8, -1, false),
      packed(PackedIntegerScheme::gptq_v2, 8, 32, true),
      packed(PackedIntegerScheme::awq, 4, 128, false),
      packed(PackedIntegerScheme::awq, 4, 32, false),
      packed(PackedIntegerScheme::awq, 4, -1, false),
      affine(2, 64),
      affine(3, 32),
      affine(4, 64),
      affine(4, 128),
      affine(5, 32),
      affine(6, 64),
      affine(8, 128),
  };
  std::uint64_t seed = 9001;
  for (const auto& weights : encodings) {
    // No tile multiples: M 37 / 300 / 1, N segments of 120/40/40 and 200 (multiples of 8: words of
    // columns), K with a half K tile at block_k 64 (2912 = 45.5 x 64) where the group allows it.
    const int group = weights.group_size > 0 ? weights.group_size : 8;
    const int k_tail = group <= 32 ? 2912 : (group == 64 ? 2880 : 1152);
    check_quantized_gemm(weights, 37, k_tail, {120, 40, 40}, true, seed++);
    check_quantized_gemm(weights, 300, 4096, {4096, 1024, 1024}, false, seed++);
    check_quantized_gemm(weights, 1, k_tail, {200}, true, seed++);
  }
}

TEST_CASE("projection GEMM throughput on a prefill-sized QKV product", "[.][benchmark][gpu][gemm]") {
  struct Shape {
    int m, n, k;
  };
  // The large shape comes again last: the spread between its two timings is the noise.
  const std::vector<Shape> shapes = {{8192, 6144, 4096}, {300, 6144, 4096}, {300, 4096, 4096},
                                     {37, 4096, 4096},   {1, 6144, 4096},   {8192, 6144, 4096}};
  const config::Arch arch = device_arch();
  std::mt19937_64 rng(7);
  driver::Stream stream = driver::Stream::create();
  std::printf("\n%-20s %-12s %10s %10s %s\n", "shape (M N K)", "tiling", "median ms", "TFLOP/s", "");
  for (const Shape& shape : shapes) {
    // Random data (never zeros), three segments like a Llama-style q | k | v split.
    const driver::DeviceBuffer d_a =
        driver::DeviceBuffer::from_host(random_bf16(std::size_t(shape.m) * shape.k, rng, 0.0, 1.0));
    const driver::DeviceBuffer d_w = driver::DeviceBuffer::from_host(
        random_bf16(std::size_t(shape.n) * shape.k, rng, 0.0, 1.0 / std::sqrt(shape.k)));
    driver::DeviceBuffer d_c(std::size_t(shape.m) * shape.n * 2);
    GemmParams params = dense_gemm_params(d_a, d_c, shape.m, shape.n, shape.k, shape.n);
    const int q_width = shape.n * 2 / 3;
    const int kv_width = (shape.n - q_width) / 2;
    const int bounds[] = {0, q_width, q_width + kv_width, shape.n};
    for (int s = 0; s < 3; ++s) {
      params.segments[s] = {d_w.data<const bf16_bits>() + std::size_t(bounds[s]) * shape.k, nullptr,
                            bounds[s], bounds[s + 1]};
    }
    gpu().context.synchronize();
    const plan::GemmTiling chosen = plan::choose_gemm_tiling(shape.m, shape.n, shape.k, arch);
    for (const plan::GemmTiling& tiling : kTilings) {
      const plan::GemmSpec spec{.segments = 3, .has_bias = false, .tiling = tiling};
      spec.check(params);
      const driver::Function& function = gemm_function(spec);
      const driver::LaunchShape launch_shape = spec.launch_shape(shape.m, shape.n);
      for (int i = 0; i < 5; ++i) driver::launch(function, launch_shape, stream.handle(), params);
      std::vector<float> milliseconds;
      for (int i = 0; i < 20; ++i) {
        const driver::Event start = driver::Event::create();
        const driver::Event stop = driver::Event::create();
        start.record(stream.handle());
        driver::launch(function, launch_shape, stream.handle(), params);
        stop.record(stream.handle());
        milliseconds.push_back(driver::elapsed_ms(start, stop));
      }
      std::nth_element(milliseconds.begin(), milliseconds.begin() + 10, milliseconds.end());
      const double median_ms = milliseconds[10];
      const double tflops = 2.0 * shape.m * shape.n * shape.k / (median_ms * 1e-3) / 1e12;
      std::printf("%5d %5d %5d    %-12s %10.4f %10.1f %s\n", shape.m, shape.n, shape.k,
                  tiling_name(tiling).c_str(), median_ms, tflops, tiling == chosen ? "<- heuristic" : "");
      CHECK(median_ms > 0);
    }
  }
}

namespace {

// The median of 20 CUDA-event timings of what `enqueue` queues on `stream`, after 5 warm-up runs, in ms.
double median_ms(const std::function<void()>& enqueue, const driver::Stream& stream) {
  for (int i = 0; i < 5; ++i) enqueue();
  std::vector<float> milliseconds;
  for (int i = 0; i < 20; ++i) {
    const driver::Event start = driver::Event::create();
    const driver::Event stop = driver::Event::create();
    start.record(stream.handle());
    enqueue();
    stop.record(stream.handle());
    milliseconds.push_back(driver::elapsed_ms(start, stop));
  }
  std::nth_element(milliseconds.begin(), milliseconds.begin() + 10, milliseconds.end());
  stream.synchronize();
  return double(milliseconds[10]);
}

double median_launch_ms(const plan::GemmSpec& spec, const GemmParams& params, const driver::Stream& stream) {
  const driver::Function& function = gemm_function(spec);
  return median_ms(
      [&] { plan::launch_gemm(function, spec, params, stream.handle(), device_multiprocessors()); }, stream);
}

// The dequantized path on quantized `params` (`segments` segments of `weights`), as the plan launches it:
// the dequantize kernel into `workspace` (W [N, K] bf16), then `gemm` over it, timed as one. Poisons C first
// (params.c, `c` on the device), so C holds the path's output after.
double median_dequantized_ms(const config::WeightEncoding& weights, int segments, const GemmParams& params,
                             const plan::GemmSpec& gemm, driver::DeviceBuffer& workspace,
                             driver::DeviceBuffer& c, const driver::Stream& stream) {
  std::vector<int> widths;
  for (int s = 0; s < segments; ++s) widths.push_back(params.segments[s].n_end - params.segments[s].n_begin);
  const plan::DequantizeSpec dequantize = plan::choose_dequantize(segments, weights, params.k, widths);
  const DequantizeParams dequantize_params{params, workspace.data<bf16_bits>()};
  dequantize.check(dequantize_params);
  const GemmParams on_dequantized = plan::dequantized_gemm_params(params, dequantize_params.weight);
  gemm.check(on_dequantized);
  const driver::Function& dequantize_function =
      kernel_function(dequantize.source(), dequantize.dynamic_shared_bytes());
  const driver::Function& gemm_kernel = gemm_function(gemm);
  c.fill_bytes_async(kPoisonByte, stream.handle());
  return median_ms(
      [&] {
        plan::launch_dequantize(dequantize_function, dequantize, dequantize_params, stream.handle());
        plan::launch_gemm(gemm_kernel, gemm, on_dequantized, stream.handle(), device_multiprocessors());
      },
      stream);
}

}  // namespace

namespace {

// Launches enqueue() back to back until at least `ms` of GPU time has passed (batches timed by events,
// doubling): the sustained clocks of docs/performance.md before a timing.
void run_for_ms(const std::function<void()>& enqueue, double ms, const driver::Stream& stream) {
  double elapsed = 0;
  for (int batch = 1; elapsed < ms; batch = std::min(2 * batch, 256)) {
    const driver::Event start = driver::Event::create();
    const driver::Event stop = driver::Event::create();
    start.record(stream.handle());
    for (int i = 0; i < batch; ++i) enqueue();
    stop.record(stream.handle());
    stop.synchronize();
    elapsed += driver::elapsed_ms(start, stop);
  }
}

// The table of the two speed tests below: each shape and token count, each wgmma tiling the segments allow.
// `copies` identical copies of A and W are launched in turn (3: each copy's A and W are > 2x an H200's L2
// apart, so every launch reads them from HBM, as in `attnplan bench`), after `warmup_ms` of launches (300:
// the power-capped clocks a sustained load runs at), or 1 copy and 5 warm-up launches (L2-warm, boost
// clocks). Every output is compared with the first tiling's and checked fully written.
void time_wgmma_tilings(int copies, double warmup_ms) {
  const config::Arch arch = device_arch();
  if (arch.sm() != 90 || !arch.arch_specific) {
    WARN("the wgmma kernel needs sm_90a; " << arch.name() << " skips it");
    return;
  }
  struct Shape {
    const char* name;
    std::vector<int> widths;
    int k;
    std::vector<int> tokens;
  };
  const std::vector<Shape> shapes = {
      {"Llama-3.1-8B q|k|v", {4096, 1024, 1024}, 4096, {512, 2048, 8192}},
      {"Llama-3.1-8B o", {4096}, 4096, {512, 2048, 8192}},
      {"gpt-oss-20b q|k|v", {4096, 512, 512}, 2880, {512, 2048}},
      {"Qwen3-32B o", {5120}, 8192, {512, 2048}},
      {"Qwen3-32B q|k|v", {8192, 1024, 1024}, 5120, {512, 2048}},
  };
  constexpr std::size_t kMaxM = 8192, kMaxN = 10240, kMaxK = 8192;
  gpu().context.make_current();
  std::mt19937_64 rng(11);
  const std::vector<std::uint16_t> a_values = random_bf16(kMaxM * kMaxK, rng, 0.1, 1.0);
  const std::vector<std::uint16_t> w_values = random_bf16(kMaxN * kMaxK, rng, 0.0, 1.0 / std::sqrt(4096.0));
  std::vector<driver::DeviceBuffer> d_as, d_ws;
  for (int copy = 0; copy < copies; ++copy) {
    d_as.push_back(driver::DeviceBuffer::from_host(a_values));
    d_ws.push_back(driver::DeviceBuffer::from_host(w_values));
  }
  driver::DeviceBuffer d_c(kMaxM * kMaxN * 2);
  driver::Stream stream = driver::Stream::create();
  gpu().context.synchronize();
  std::printf("\n%-19s %-17s %-24s %10s %10s\n", "shape", "M N K", "kernel", "median ms", "TFLOP/s");
  for (const Shape& shape : shapes) {
    for (const int m : shape.tokens) {
      const int n = std::accumulate(shape.widths.begin(), shape.widths.end(), 0);
      const int k = shape.k;
      std::vector<GemmParams> per_copy;
      for (int copy = 0; copy < copies; ++copy) {
        GemmParams params = dense_gemm_params(d_as[copy], d_c, m, n, k, n);
        int n_begin = 0;
        for (std::size_t s = 0; s < shape.widths.size(); ++s) {
          params.segments[s] = {d_ws[copy].data<const bf16_bits>() + std::size_t(n_begin) * k, nullptr,
                                n_begin, n_begin + shape.widths[s]};
          n_begin += shape.widths[s];
        }
        per_copy.push_back(params);
      }
      const plan::GemmKernelChoice choice = plan::choose_gemm_kernel(arch, m, n, k, shape.widths);
      std::vector<std::uint16_t> baseline;
      for (const plan::GemmSm90Tiling& tiling : kSm90Tilings) {
        if (!plan::gemm_sm90_segments_fit(shape.widths, tiling.block_n)) continue;
        const plan::GemmSpec spec{int(shape.widths.size()), false, kTilings[0], plan::GemmKernel::wgmma,
                                  tiling};
        for (const GemmParams& params : per_copy) spec.check(params);
        const driver::Function& function = gemm_function(spec);
        std::size_t launch = 0;
        const auto enqueue = [&] {
          plan::launch_gemm(function, spec, per_copy[launch++ % per_copy.size()], stream.handle(),
                            device_multiprocessors());
        };
        run_for_ms(enqueue, warmup_ms, stream);
        d_c.fill_bytes_async(kPoisonByte, stream.handle());
        const double ms = median_ms(enqueue, stream);
        const double tflops = 2.0 * m * n * double(k) / (ms * 1e-3) / 1e12;
        std::vector<std::uint16_t> output = d_c.download_all<std::uint16_t>();
        output.resize(std::size_t(m) * n);
        const std::size_t unwritten = std::size_t(std::count(output.begin(), output.end(), kPoisonBits));
        const double difference = baseline.empty()
                                      ? 0.0
                                      : reference::relative_l2_error(core::bf16_to_doubles(baseline),
                                                                     core::bf16_to_doubles(output));
        if (baseline.empty()) baseline = output;
        std::printf("%-19s %5d %5d %5d  %-24s %10.4f %10.1f  rel. L2 %.2e, unwritten %zu %s\n", shape.name, m,
                    n, k, spec_name(spec).c_str(), ms, tflops, difference, unwritten,
                    choice.kernel == plan::GemmKernel::wgmma && choice.sm90 == tiling ? "<- plan" : "");
        CHECK(unwritten == 0);
        CHECK(difference < 1e-2);
      }
    }
  }
}

}  // namespace

// The numbers issue #6 is about: the q|k|v (in q | k | v segments) and o products of Llama-3.1-8B (K 4096)
// at 512, 2048 and 8192 tokens, and of the N = 5120 shapes (gpt-oss-20b q|k|v, Qwen3-32B o) and Qwen3-32B
// q|k|v at 512 and 2048, each wgmma tiling the segments allow without and with clusters of 2 (W multicast);
// "<-" marks choose_gemm_kernel's pick for that M. Median of 20 CUDA-event timings after 5 warm-up
// launches, A and W L2-warm. Every output is compared with the first tiling's (which `[gemm]` checks against
// the reference; a CPU reference of this size is too slow). Run: test_gpu "[.gemm_speed]".
TEST_CASE("projection GEMM speed: wgmma tilings with and without clusters", "[.gemm_speed][gpu][gemm]") {
  time_wgmma_tilings(1, 0);
}

// The same table as `attnplan bench` would time it: A and W from HBM (three copies in turn) after 300 ms of
// warm-up at the sustained clocks. Run: test_gpu "[.gemm_speed_sustained]".
TEST_CASE("projection GEMM speed at the sustained clocks, operands from HBM",
          "[.gemm_speed_sustained][gpu][gemm]") {
  time_wgmma_tilings(3, 300);
}

namespace {

// The formats the sm_90a mixed-input kernel reads.
std::vector<config::WeightEncoding> w4_encodings() {
  std::vector<config::WeightEncoding> encodings;
  for (auto format : {config::WeightFormat::mxfp4, config::WeightFormat::nvfp4}) {
    config::WeightEncoding encoding;
    encoding.format = format;
    encodings.push_back(encoding);
  }
  for (int group : {32, 64, 128}) encodings.push_back(testing::affine_encoding(4, group));
  encodings.push_back(testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 128, false));
  encodings.push_back(testing::packed_encoding(config::PackedIntegerScheme::gptq_v2, 4, -1, false));
  // AWQ's words [K, N / 8].
  encodings.push_back(testing::packed_encoding(config::PackedIntegerScheme::awq, 4, 128, false));
  encodings.push_back(testing::packed_encoding(config::PackedIntegerScheme::awq, 4, -1, false));
  return encodings;
}

}  // namespace

// The sm_90a mixed-input GEMM (wgmma_w4: dequantized 4-bit weights as wgmma's register A operand) against
// the reference, per format, on shapes that are no tile multiple. Run: test_gpu "[gemm_w4]".
TEST_CASE("sm_90a 4-bit weight GEMM matches the reference per format", "[gpu][gemm][gemm_w4]") {
  const config::Arch arch = device_arch();
  if (arch.sm() != 90 || !arch.arch_specific) {
    WARN("wgmma_w4 needs sm_90a; " << arch.name() << " skips it");
    return;
  }
  std::uint64_t seed = 6100;
  for (const config::WeightEncoding& weights : w4_encodings()) {
    // The plan picks this kernel for the Llama-3.1-8B QKV shape (unless sm90_w4_gemm_enabled says no; the
    // kernel is tested either way).
    const int llama[] = {4096, 1024, 1024};
    const bool enabled = plan::sm90_w4_gemm_enabled();
    // AWQ's rows of N / 8 words must be 16-byte strides: its segments are multiples of 32 wide.
    const bool awq = plan::is_awq(weights);
    CHECK(plan::choose_w4_gemm_kernel(weights, arch, 2048, 6144, 4096, llama).kernel ==
          (enabled ? plan::GemmKernel::wgmma_w4 : plan::GemmKernel::mma_sync));
    // NVRTC takes seconds per specialization: the cases share four (segments, bias, tiling) per format.
    // M 1000 (3.9 tiles of 256), N 1536 + 64 (12.5 tiles of 128, a ragged last segment), K 4096, bias.
    check_quantized_gemm(weights, 1000, 4096, {1536, 64}, true, seed++, {{256, 5}, {128, 8}});
    // K not a multiple of 128 where the group allows: 4064 = 63.5 slots of 64, 4032 = 63 slots (groups of
    // 64); groups of 128 take 3968 = 31 x 128. No bias (the Llama QKV specialization).
    const int k_tail = weights.group_size == 128 ? 3968 : (weights.group_size == 64 ? 4032 : 4064);
    check_quantized_gemm(weights, 1000, k_tail, {1536, 64}, false, seed++, {{256, 5}});
    // Three segments with bias (a q | k | v split), few tokens, then one token: the heuristic's 128-token
    // tile for both.
    const int k_few = 2880 - (weights.group_size == 128 ? 64 : 0);
    const std::vector<int> few_widths = {256, 128, awq ? 96 : 72};
    if (enabled) {
      const plan::GemmKernelChoice few =
          plan::choose_w4_gemm_kernel(weights, arch, 37, 456, k_few, few_widths);
      CHECK(few.kernel == plan::GemmKernel::wgmma_w4);
      CHECK(few.sm90 == plan::GemmSm90Tiling{128, 8});
    }
    check_quantized_gemm(weights, 37, k_few, few_widths, true, seed++, {{128, 8}});
    check_quantized_gemm(weights, 1, k_few, {128, 128, awq ? 32 : 8}, true, seed++, {{128, 8}});
  }
}

TEST_CASE("sm_90a 8-bit weight GEMM (fp8 weight-only, mxfp8) matches the reference per format",
          "[gpu][gemm][gemm_w4]") {
  const config::Arch arch = device_arch();
  if (arch.sm() != 90 || !arch.arch_specific) {
    WARN("wgmma_w4 needs sm_90a; " << arch.name() << " skips it");
    return;
  }
  // The mixed-input kernel's 8-bit members, forced (so they run whatever sm90_w4_gemm_enabled says): codes
  // [N, K] bytes, a thread's k pair a half word, one scale per tensor, row, 128 x 128 block or 32 k (E8M0).
  std::uint64_t seed = 6300;
  for (const config::WeightEncoding& weights : testing::sm90_w8_encodings()) {
    const int llama[] = {4096, 1024, 1024};
    CHECK(plan::choose_w4_gemm_kernel(weights, arch, 2048, 6144, 4096, llama).kernel ==
          (plan::sm90_w4_gemm_enabled() ? plan::GemmKernel::wgmma_w4 : plan::GemmKernel::mma_sync));
    // M 1000 (3.9 tiles of 256), N 1536 + 64 (a ragged last segment), K 4096, bias; both tilings.
    check_quantized_gemm(weights, 1000, 4096, {1536, 64}, true, seed++, {{256, 4}, {128, 8}});
    // K past the last whole slot: 4064 = 63.5 slots of 64 (mxfp8 needs K % 32; a partial 128-wide scale
    // block for the block-scaled fp8).
    check_quantized_gemm(weights, 1000, 4064, {1536, 64}, false, seed++, {{256, 4}});
    // Three segments, few tokens, then one token.
    check_quantized_gemm(weights, 37, 2880, {256, 128, 72}, true, seed++, {{128, 8}});
    check_quantized_gemm(weights, 1, 2880, {128, 128, 8}, true, seed++, {{128, 8}});
  }
}

// Issue #6's quantized rows: the Llama-3.1-8B QKV product (N 6144 = 4096 | 1024 | 1024, K 4096) at 512, 1024,
// 2048 and 8192 tokens, the bf16 wgmma kernel (the plan's pick for bf16) next to each 4- and 8-bit format on
// mma.sync (the plan's tiling), on the dequantized path (dequantize + the bf16 row's GEMM, timed as one) and
// on wgmma_w4 (both tilings); "<-" marks the plan's pick. The rows at 512 and 1024 placed
// dequantized_min_tokens. Median of 20 CUDA-event timings after 5 warm-up launches; every output is compared
// with mma.sync's on the same weights.
// Run: test_gpu "[.gemm_w4_speed]".
TEST_CASE("quantized weight GEMM speed: wgmma_w4 and the dequantized path vs bf16 wgmma and mma.sync",
          "[.gemm_w4_speed][gpu][gemm]") {
  const config::Arch arch = device_arch();
  if (arch.sm() != 90 || !arch.arch_specific) {
    WARN("wgmma_w4 needs sm_90a; " << arch.name() << " skips it");
    return;
  }
  constexpr int n = 6144, k = 4096;
  const std::vector<int> widths = {4096, 1024, 1024};
  gpu().context.make_current();
  std::mt19937_64 rng(12);
  const driver::DeviceBuffer d_w =
      driver::DeviceBuffer::from_host(random_bf16(std::size_t(n) * k, rng, 0.0, 1.0 / std::sqrt(k)));
  // One of each code layout and decode: E2M1 (two scale kinds), affine (g64: g32 and g128 time alike), GPTQ;
  // AWQ and the 8-bit members (fp8 block-scaled weight-only, mxfp8), whose mma.sync rows are the baseline
  // they replaced; act-order GPTQ (mma.sync and the dequantized path only).
  std::vector<config::WeightEncoding> all = w4_encodings();
  for (const config::WeightEncoding& each : testing::sm90_w8_encodings()) all.push_back(each);
  all.push_back(testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 128, true));
  const std::vector<config::WeightEncoding> encodings =
      named_encodings(all, {"mxfp4", "nvfp4", "affine 4-bit g64", "gptq 4-bit g128", "awq 4-bit g128",
                            "fp8 block", "mxfp8", "gptq 4-bit g128 act_order"});
  // The dequantized path's W [N, K] bf16 (the plan's workspace region).
  driver::DeviceBuffer d_dequantized(std::size_t(n) * k * 2);
  std::vector<QuantizedWeights> quantized;
  for (std::size_t f = 0; f < encodings.size(); ++f)
    quantized.push_back(upload_quantized(encodings[f], k, widths, {}, 500 + f));
  driver::Stream stream = driver::Stream::create();
  std::printf("\n%-17s %-24s %-22s %10s %10s %s\n", "shape (M N K)", "weights", "kernel", "median ms",
              "TFLOP/s", "vs bf16 wgmma");
  for (const int m : {512, 1024, 2048, 8192}) {
    const driver::DeviceBuffer d_a =
        driver::DeviceBuffer::from_host(random_bf16(std::size_t(m) * k, rng, 0.1, 1.0));
    driver::DeviceBuffer d_c(std::size_t(m) * n * 2);
    GemmParams params = dense_gemm_params(d_a, d_c, m, n, k, n);
    gpu().context.synchronize();
    // Times `spec` on `params` (into d_c, poisoned first); returns the median ms and leaves the output in
    // d_c.
    const auto time_ms = [&](const plan::GemmSpec& spec) {
      d_c.fill_bytes_async(kPoisonByte, stream.handle());
      spec.check(params);
      return median_launch_ms(spec, params, stream);
    };
    const auto tflops = [&](double ms) { return 2.0 * m * n * double(k) / (ms * 1e-3) / 1e12; };

    const plan::GemmKernelChoice bf16_choice = plan::choose_gemm_kernel(arch, m, n, k, widths);
    plan::GemmSpec bf16{3, false, plan::choose_gemm_tiling(m, n, k, arch), bf16_choice.kernel,
                        bf16_choice.sm90};
    int bounds = 0;
    for (int s = 0; s < 3; ++s) {
      params.segments[s] = {d_w.data<const bf16_bits>() + std::size_t(bounds) * k, nullptr, bounds,
                            bounds + widths[s]};
      bounds += widths[s];
    }
    const double bf16_ms = time_ms(bf16);
    std::printf("%5d %5d %5d  %-24s %-22s %10.4f %10.1f\n", m, n, k, "bf16", spec_name(bf16).c_str(), bf16_ms,
                tflops(bf16_ms));

    for (std::size_t f = 0; f < encodings.size(); ++f) {
      std::copy(std::begin(quantized[f].segments), std::end(quantized[f].segments),
                std::begin(params.segments));
      plan::GemmSpec spec{3, false, plan::choose_gemm_tiling(m, n, k, arch)};
      spec.weights = encodings[f];
      const double mma_ms = time_ms(spec);
      const std::vector<std::uint16_t> baseline = d_c.download_all<std::uint16_t>();
      std::printf("%5d %5d %5d  %-24s %-22s %10.4f %10.1f %.2fx\n", m, n, k,
                  encoding_name(spec.weights).c_str(), spec_name(spec).c_str(), mma_ms, tflops(mma_ms),
                  bf16_ms / mma_ms);
      // The dequantized path at every M (the plan takes it from dequantized_min_tokens rows): the dequantize
      // kernel and the bf16 row's GEMM on its W, timed as one.
      {
        const double ms = median_dequantized_ms(encodings[f], 3, params, bf16, d_dequantized, d_c, stream);
        const std::vector<std::uint16_t> output = d_c.download_all<std::uint16_t>();
        const std::size_t unwritten = std::size_t(std::count(output.begin(), output.end(), kPoisonBits));
        const double difference =
            reference::relative_l2_error(core::bf16_to_doubles(baseline), core::bf16_to_doubles(output));
        std::printf(
            "%5d %5d %5d  %-24s %-22s %10.4f %10.1f %.2fx  vs mma.sync rel. L2 %.2e, unwritten %zu %s\n", m,
            n, k, encoding_name(encodings[f]).c_str(), "dequantize + bf16", ms, tflops(ms), bf16_ms / ms,
            difference, unwritten, m >= plan::dequantized_min_tokens(encodings[f]) ? "<- plan" : "");
        CHECK(unwritten == 0);
        CHECK(difference < 1e-2);
      }
      if (!plan::sm90_w4_gemm_supports(encodings[f])) continue;  // act order: no wgmma_w4 member
      const plan::GemmKernelChoice choice = plan::choose_w4_gemm_kernel(encodings[f], arch, m, n, k, widths);
      const bool eight = encodings[f].format == config::WeightFormat::fp8 ||
                         encodings[f].format == config::WeightFormat::mxfp8;
      CHECK(choice.kernel ==
            (plan::sm90_w4_gemm_enabled() ? plan::GemmKernel::wgmma_w4 : plan::GemmKernel::mma_sync));
      for (const plan::GemmSm90Tiling tiling :
           {plan::GemmSm90Tiling{256, eight ? 4 : 5}, plan::GemmSm90Tiling{128, 8}}) {
        spec.kernel = plan::GemmKernel::wgmma_w4;
        spec.sm90 = tiling;
        const double ms = time_ms(spec);
        const std::vector<std::uint16_t> output = d_c.download_all<std::uint16_t>();
        const std::size_t unwritten = std::size_t(std::count(output.begin(), output.end(), kPoisonBits));
        const double difference =
            reference::relative_l2_error(core::bf16_to_doubles(baseline), core::bf16_to_doubles(output));
        std::printf(
            "%5d %5d %5d  %-24s %-22s %10.4f %10.1f %.2fx  vs mma.sync rel. L2 %.2e, unwritten %zu %s\n", m,
            n, k, encoding_name(spec.weights).c_str(), spec_name(spec).c_str(), ms, tflops(ms), bf16_ms / ms,
            difference, unwritten,
            choice.sm90 == tiling && m < plan::dequantized_min_tokens(encodings[f]) ? "<- plan" : "");
        CHECK(unwritten == 0);
        CHECK(difference < 1e-2);
      }
    }
  }
}

namespace {

// The formats the sm_90a decoding kernel reads (codes in rows of bytes, or AWQ's words): wgmma_w4's but
// GPTQ's words, and the 8-bit ones.
std::vector<config::WeightEncoding> decode_encodings() {
  std::vector<config::WeightEncoding> encodings = w4_encodings();
  std::erase_if(encodings,
                [](const config::WeightEncoding& each) { return !plan::sm90_decode_gemm_supports(each); });
  for (const config::WeightEncoding& encoding : testing::sm90_w8_encodings()) encodings.push_back(encoding);
  return encodings;
}

int code_bits(const config::WeightEncoding& encoding) {
  return encoding.format == config::WeightFormat::fp8 || encoding.format == config::WeightFormat::mxfp8 ? 8
                                                                                                        : 4;
}

}  // namespace

// The sm_90a decoding GEMM (wgmma_decode: the producer warpgroup decodes the codes into the bf16 kernel's W
// slots) against the reference, per format, every tile width, on shapes that are no tile multiple.
// Run: test_gpu "[gemm_decode]"; ATTNPLAN_DECODE_FORMATS="awq" checks only the formats whose name holds
// that text (encoding_name: "awq 4-bit g128", "nvfp4", "affine 4-bit g64", ...).
TEST_CASE("sm_90a decoding weight GEMM matches the reference per format", "[gpu][gemm][gemm_decode]") {
  const config::Arch arch = device_arch();
  if (arch.sm() != 90 || !arch.arch_specific) {
    WARN("wgmma_decode needs sm_90a; " << arch.name() << " skips it");
    return;
  }
  std::uint64_t seed = 6700;
  const char* const only = std::getenv("ATTNPLAN_DECODE_FORMATS");
  for (const config::WeightEncoding& weights : decode_encodings()) {
    if (only != nullptr && encoding_name(weights).find(only) == std::string::npos) {
      seed += 5;  // each format keeps its data (five cases) with or without the filter
      continue;
    }
    const int bits = code_bits(weights);
    const auto tiling = [&](int block_n, int cluster_m) {
      return plan::gemm_sm90_decode_tiling(block_n, bits, cluster_m);
    };
    // Every width, then clusters along M: shares of 96, 48 (a half pass) and 32 rows, 80 (16-row pieces);
    // the short launches' 96 and 64 (shares of 48 and 32 rows).
    std::vector<plan::GemmSm90Tiling> all, straddling;
    for (const int block_n : {192, 160, 128}) all.push_back(tiling(block_n, 1));
    for (const auto& [block_n, cluster_m] :
         {std::pair{192, 2}, {192, 4}, {128, 4}, {160, 2}, {96, 2}, {64, 2}, {64, 1}})
      all.push_back(tiling(block_n, cluster_m));
    for (const auto& [block_n, cluster_m] :
         {std::pair{192, 1}, {160, 1}, {192, 4}, {160, 2}, {96, 1}, {96, 2}})
      straddling.push_back(tiling(block_n, cluster_m));
    // AWQ's code boxes are rows of N / 8 words: shares of whole 32-row pieces, segments of whole 32 rows.
    const bool awq = plan::is_awq(weights);
    if (awq) {
      for (std::vector<plan::GemmSm90Tiling>* list : {&all, &straddling}) {
        std::erase_if(*list, [](const plan::GemmSm90Tiling& each) {
          return !plan::sm90_decode_awq_share_fits(each.block_n, each.cluster_m);
        });
      }
    }
    const int last = awq ? 992 : 1000, few_last = awq ? 32 : 8;
    const auto decode = plan::GemmKernel::wgmma_decode;
    // M 1000 (7.8 tiles of 128: clusters of 4 pad the last), N 1536 + 64 (a ragged last segment), K 4096,
    // bias; every width.
    check_quantized_gemm(weights, 1000, 4096, {1536, 64}, true, seed++, all, decode);
    // K past the last whole slot where the group allows (4064 = 63.5 slots; groups of 64: 4032, of 128:
    // 3968), no bias.
    const int k_tail = weights.group_size == 128 ? 3968 : (weights.group_size == 64 ? 4032 : 4064);
    // The two widest unclustered tilings (AWQ has no 160).
    const std::vector<plan::GemmSm90Tiling> widest = {tiling(192, 1), awq ? tiling(128, 1) : tiling(160, 1)};
    check_quantized_gemm(weights, 1000, k_tail, {1536, 64}, false, seed++, widest, decode);
    // q | k | v segments of 32-row multiples that 160- and 192-wide tiles straddle (code pieces from two
    // segments), few tokens (one row tile: a cluster's other CTAs lie past M), bias; then one token.
    const int k_few = 2880 - (weights.group_size == 128 ? 64 : 0);
    check_quantized_gemm(weights, 37, k_few, {4064, 1056, last}, true, seed++, straddling, decode);
    // gpt-oss-20b's q | k | v: in 96 x2 the share at rows 4560-4607 ends at the k | v boundary and its
    // partial pass's threads past the share once read their scales past k's (session 20; compute-sanitizer
    // memcheck flags such reads, tools/sanitize.sh).
    check_quantized_gemm(weights, 64, k_few, {4096, 512, 512}, true, seed++,
                         {awq ? tiling(192, 2) : tiling(96, 2)}, decode);
    check_quantized_gemm(weights, 1, k_few, {128, 128, few_last}, true, seed++,
                         {awq ? tiling(192, 2) : tiling(128, 1), tiling(64, 2)}, decode);
  }
}

namespace {

// The comma-separated integers of environment variable `name`, or `fallback` where it is unset or empty.
std::vector<int> env_integers(const char* name, std::vector<int> fallback) {
  const char* const text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  std::vector<int> values;
  for (const char* at = text; *at != '\0';) {
    char* end = nullptr;
    values.push_back(int(std::strtol(at, &end, 10)));
    REQUIRE(end != at);
    at = *end == ',' ? end + 1 : end;
  }
  return values;
}

}  // namespace

// The 4-bit rows of issue #6 on the decoding kernel: Llama-3.1-8B q|k|v (6144 = 4096 | 1024 | 1024, K 4096)
// and o (4096 x 4096), gpt-oss-20b q|k|v (5120 x 2880) at 512, 2048 and 8192 tokens; per format the
// dequantized path (dequantize + the bf16 GEMM, timed as one; the plan's pick past its switch point),
// wgmma_w4 (choose_w4_gemm_kernel's tiling) and wgmma_decode (choose_decode_gemm_kernel's, "<-", then the
// other widths), next to the bf16 GEMM of the same shape. Median of 20 CUDA-event timings after 5 warm-up
// launches, L2-warm (the 4-bit weights fit in L2; the dequantized path's bf16 W does not). Every output is
// compared with the dequantized path's (same bf16 weights: rel. L2 ~0). Run: test_gpu "[.gemm_decode_speed]".
// ATTNPLAN_SPEED_TOKENS="64,256" times other launch lengths; ATTNPLAN_SPEED_WIDTHS="96,64" times only those
// widths besides the chooser's pick (each unclustered and in clusters of 2); ATTNPLAN_SPEED_FORMATS="3"
// only the first formats (mxfp4, nvfp4, MLX g64, fp8 block, AWQ g128, GPTQ g128; default 4: AWQ's after
// session 22 and GPTQ's after session 23 only when asked for); ATTNPLAN_DECODE_FORMATS="gptq" first keeps
// only the formats whose name holds that text.
TEST_CASE("decoding weight GEMM speed: wgmma_decode against wgmma_w4, the dequantized path and bf16",
          "[.gemm_decode_speed][gpu][gemm]") {
  const config::Arch arch = device_arch();
  if (arch.sm() != 90 || !arch.arch_specific) {
    WARN("wgmma_decode needs sm_90a; " << arch.name() << " skips it");
    return;
  }
  const std::vector<int> token_counts = env_integers("ATTNPLAN_SPEED_TOKENS", {512, 2048, 8192});
  const std::vector<int> chosen_widths = env_integers("ATTNPLAN_SPEED_WIDTHS", {});
  const std::vector<int> widths =
      chosen_widths.empty() ? std::vector<int>{192, 160, 128, 96, 64} : chosen_widths;
  const std::vector<int> cluster_sizes =
      chosen_widths.empty() ? std::vector<int>{1, 2, 4} : std::vector<int>{1, 2};
  struct Shape {
    const char* name;
    int n, k;
    std::vector<int> widths;
  };
  const Shape shapes[] = {{"Llama-3.1-8B q|k|v", 6144, 4096, {4096, 1024, 1024}},
                          {"Llama-3.1-8B o", 4096, 4096, {4096}},
                          {"gpt-oss-20b q|k|v", 5120, 2880, {4096, 512, 512}}};
  std::vector<config::WeightEncoding> encodings = named_encodings(
      decode_encodings(),
      {"mxfp4", "nvfp4", "affine 4-bit g64", "fp8 block", "awq 4-bit g128", "gptq 4-bit g128"});
  if (const char* const only = std::getenv("ATTNPLAN_DECODE_FORMATS")) {
    std::erase_if(encodings, [&](const config::WeightEncoding& each) {
      return encoding_name(each).find(only) == std::string::npos;
    });
  }
  encodings.resize(std::min<std::size_t>(encodings.size(),
                                         std::size_t(env_integers("ATTNPLAN_SPEED_FORMATS", {4}).front())));
  gpu().context.make_current();
  std::mt19937_64 rng(16);
  driver::Stream stream = driver::Stream::create();
  std::printf("\n%-19s %5s %5s %5s  %-22s %-32s %10s %10s %s\n", "shape", "M", "N", "K", "weights", "kernel",
              "median ms", "TFLOP/s", "vs bf16");
  for (const Shape& shape : shapes) {
    const int n = shape.n, k = shape.k;
    const int segments = int(shape.widths.size());
    const driver::DeviceBuffer d_w =
        driver::DeviceBuffer::from_host(random_bf16(std::size_t(n) * k, rng, 0.0, 1.0 / std::sqrt(k)));
    driver::DeviceBuffer d_dequantized(std::size_t(n) * k * 2);
    std::vector<QuantizedWeights> quantized;
    for (std::size_t f = 0; f < encodings.size(); ++f)
      quantized.push_back(upload_quantized(encodings[f], k, shape.widths, {}, 900 + f));
    for (const int m : token_counts) {
      const driver::DeviceBuffer d_a =
          driver::DeviceBuffer::from_host(random_bf16(std::size_t(m) * k, rng, 0.1, 1.0));
      driver::DeviceBuffer d_c(std::size_t(m) * n * 2);
      GemmParams params = dense_gemm_params(d_a, d_c, m, n, k, n);
      gpu().context.synchronize();
      const auto tflops = [&](double ms) { return 2.0 * m * n * double(k) / (ms * 1e-3) / 1e12; };
      const auto row = [&](const std::string& weights, const std::string& kernel, double ms, double bf16_ms,
                           const char* note) {
        std::printf("%-19s %5d %5d %5d  %-22s %-32s %10.4f %10.1f %.2fx %s\n", shape.name, m, n, k,
                    weights.c_str(), kernel.c_str(), ms, tflops(ms), bf16_ms / ms, note);
      };

      // bf16: the plan's pick for this M (its small-launch tiling where that is cheaper).
      const plan::GemmKernelChoice bf16_choice = plan::choose_gemm_kernel(arch, m, n, k, shape.widths);
      const plan::GemmKernelChoice bf16_small = plan::choose_gemm_kernel(arch, 512, n, k, shape.widths);
      plan::GemmSpec bf16{segments, false, plan::choose_gemm_tiling(m, n, k, arch), bf16_choice.kernel,
                          bf16_choice.sm90};
      if (plan::choose_gemm_variant(m, n, bf16_choice.sm90, bf16_small.sm90, device_multiprocessors()).small)
        bf16.sm90 = bf16_small.sm90;
      int bounds = 0;
      for (int s = 0; s < segments; ++s) {
        params.segments[s] = {d_w.data<const bf16_bits>() + std::size_t(bounds) * k, nullptr, bounds,
                              bounds + shape.widths[s]};
        bounds += shape.widths[s];
      }
      bf16.check(params);
      const double bf16_ms = median_launch_ms(bf16, params, stream);
      row("bf16", spec_name(bf16), bf16_ms, bf16_ms, "");

      for (std::size_t f = 0; f < encodings.size(); ++f) {
        const config::WeightEncoding& weights = encodings[f];
        std::copy(std::begin(quantized[f].segments), std::end(quantized[f].segments),
                  std::begin(params.segments));
        // Where the plan switches to the dequantized path: past the one wave of the decoding kernel as
        // the plan tiles it (kDecodeTiledTokens) for the formats planned on it, else the format's rule.
        int plan_dequantized_from = plan::dequantized_min_tokens(weights);
        if (plan::sm90_decode_gemm_planned(weights)) {
          const plan::GemmKernelChoice planned = plan::choose_decode_gemm_kernel(
              weights, arch, std::min(m, plan::kDecodeTiledTokens), n, k, shape.widths);
          plan_dequantized_from =
              plan::decode_dequantized_min_tokens(planned.sm90, n, plan::typical_sm_count(arch));
        }
        // The dequantized path: the baseline every other output is compared with.
        const double dequantized_ms =
            median_dequantized_ms(weights, segments, params, bf16, d_dequantized, d_c, stream);
        const std::vector<std::uint16_t> baseline = d_c.download_all<std::uint16_t>();
        row(encoding_name(weights), "dequantize + " + spec_name(bf16), dequantized_ms, bf16_ms,
            m >= plan_dequantized_from ? "(plan today)" : "");
        CHECK(std::count(baseline.begin(), baseline.end(), kPoisonBits) == 0);

        const auto time_spec = [&](const plan::GemmSpec& spec, const char* note) {
          spec.check(params);
          d_c.fill_bytes_async(kPoisonByte, stream.handle());
          const double ms = median_launch_ms(spec, params, stream);
          const std::vector<std::uint16_t> output = d_c.download_all<std::uint16_t>();
          const std::size_t unwritten = std::size_t(std::count(output.begin(), output.end(), kPoisonBits));
          const double difference =
              reference::relative_l2_error(core::bf16_to_doubles(baseline), core::bf16_to_doubles(output));
          row(encoding_name(weights), spec_name(spec), ms, bf16_ms, note);
          std::printf("%-19s %36s rel. L2 vs dequantized %.2e, unwritten %zu\n", "", "", difference,
                      unwritten);
          CHECK(unwritten == 0);
          CHECK(difference < 1e-2);
        };
        const plan::GemmKernelChoice w4 = plan::choose_w4_gemm_kernel(weights, arch, m, n, k, shape.widths);
        if (w4.kernel == plan::GemmKernel::wgmma_w4) {
          plan::GemmSpec spec{segments, false, bf16.tiling, w4.kernel, w4.sm90};
          spec.weights = weights;
          time_spec(spec, m < plan_dequantized_from && !plan::sm90_decode_gemm_planned(weights)
                              ? "(plan today)"
                              : "");
        }
        const plan::GemmKernelChoice decode =
            plan::choose_decode_gemm_kernel(weights, arch, m, n, k, shape.widths);
        REQUIRE(decode.kernel == plan::GemmKernel::wgmma_decode);
        plan::GemmSpec spec{segments, false, bf16.tiling, decode.kernel, decode.sm90};
        spec.weights = weights;
        time_spec(spec, "<- choose_decode_gemm_kernel");
        for (const int block_n : widths) {
          if (!plan::gemm_sm90_segments_fit(shape.widths, block_n)) continue;
          for (const int cluster_m : cluster_sizes) {
            if ((block_n == decode.sm90.block_n && cluster_m == decode.sm90.cluster_m) ||
                block_n % (16 * cluster_m) != 0 || (cluster_m > 1 && m > 2048) ||
                (block_n < 128 && m > 512) ||
                (weights.format == config::WeightFormat::packed_integer &&
                 !plan::sm90_decode_awq_share_fits(block_n, cluster_m)))
              continue;
            spec.sm90 = plan::gemm_sm90_decode_tiling(block_n, code_bits(weights), cluster_m);
            time_spec(spec, "");
          }
        }
      }
    }
  }
}
