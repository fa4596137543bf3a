// The fp8-activation projection on sm_90a (plan/gemm_fp8.hpp): the quantizer's codes and scales against
// reference::quantize_activations_fp8 bit for bit, then the e4m3 GEMM against reference::linear over the
// reference's dequantized activations and weights (the same roundings, so only accumulation order
// differs) for tensor / channel / block weight scales, segments, bias, M and N and K no tile multiples,
// poisoned outputs with guard columns; the wgmma kernel on sm_90a and the sm_89 mma.sync kernel on any arch
// from sm_89 ([gemm_fp8_sm89]). Then [.gemm_fp8_speed]: 8192x6144x4096 (wgmma). Skipped without fp8 cores.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
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
#include "plan/gemm_fp8.hpp"
#include "reference/compare.hpp"
#include "reference/dequantize.hpp"
#include "reference/fp8_activation.hpp"
#include "reference/layer.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::gpu_testing;

namespace {

// The wgmma kernel needs sm_90a; the mma.sync one any arch from sm_89 (so the H200 runs both).
bool fp8_gemm_here(plan::GemmFp8Kernel kernel) {
  const config::Arch arch = device_arch();
  return kernel == plan::GemmFp8Kernel::wgmma ? arch.sm() == 90 && arch.arch_specific
                                              : plan::fp8_activation_gemm_available(arch);
}

void check_fp8_gemm(plan::GemmFp8Kernel kernel, config::Fp8ScaleGranularity granularity, int m, int k,
                    const std::vector<int>& widths, bool has_bias, std::uint64_t seed) {
  gpu().context.make_current();
  const int n = std::accumulate(widths.begin(), widths.end(), 0);
  const long long ldc = n + 8;
  std::mt19937_64 rng(seed);
  // Activations with a spread of magnitudes per token (outlier channels are what per-group scales are for).
  std::vector<std::uint16_t> a_bits = random_bf16(std::size_t(m) * k, rng, 0.1, 1.0);
  for (std::size_t i = 0; i < a_bits.size(); i += 97) {
    a_bits[i] = core::float_to_bf16(core::bf16_to_float(a_bits[i]) * 20.0f);
  }
  const std::vector<std::uint16_t> bias_bits = random_bf16(n, rng, 0.0, 0.5);
  driver::DeviceBuffer d_a = upload_with_nan_tail(a_bits, k);

  config::WeightEncoding weights;
  weights.format = config::WeightFormat::fp8;
  weights.scale_granularity = granularity;
  weights.activation = config::ActivationType::fp8;
  // The kernel's own configuration (stages) as the plan picks it: sm_90a for wgmma, sm_89 for mma.sync.
  plan::GemmFp8Spec spec = plan::choose_fp8_gemm(
      kernel == plan::GemmFp8Kernel::wgmma ? config::Arch{9, 0, true} : config::Arch{8, 9, false});
  REQUIRE(spec.kernel == kernel);
  spec.segments = int(widths.size());
  spec.has_bias = has_bias;
  spec.granularity = granularity;

  GemmParams params{};
  const QuantizedSegments w = upload_quantized_segments(
      weights, k, widths, has_bias ? bias_bits : std::vector<std::uint16_t>{}, seed, params);
  driver::DeviceBuffer d_c(std::size_t(m + 1) * ldc * 2);
  driver::DeviceBuffer d_activations(plan::fp8_activation_bytes(m, k));
  const plan::Fp8ActivationBuffers activations =
      plan::fp8_activation_buffers(d_activations.data<void>(), m, k);
  params.a = d_a.data<const bf16_bits>();
  params.c = d_c.data<bf16_bits>();
  params.m = m;
  params.n = n;
  params.k = k;
  params.lda = k;
  params.ldc = ldc;

  // One scale per token for tensor and channel weight scales, per 128 channels for block ones.
  const reference::Fp8Activations quantized =
      reference::quantize_activations_fp8(a_bits, m, k, spec.activation_scales());
  const reference::Tensor expected =
      reference::linear(reference::dequantize_activations_fp8(quantized), w.weight, w.bias);

  driver::Stream stream = driver::Stream::create();
  gpu().context.synchronize();
  INFO("fp8 activations, " << plan::gemm_fp8_kernel_name(kernel) << ", weight scales "
                           << config::to_string(granularity) << ": M " << m << " N " << n << " K " << k);
  // Named sources: GCC 13 flags a reference returned for a temporary argument (the kernels live in a map).
  const compiler::KernelSource quantize_source = plan::Fp8QuantizeSpec{spec.activation_scales()}.source();
  const compiler::KernelSource gemm_source = spec.source();
  const driver::Function& quantize = kernel_function(quantize_source, 0);
  const driver::Function& gemm = kernel_function(gemm_source, spec.dynamic_shared_bytes());
  d_c.fill_bytes_async(kPoisonByte, stream.handle());
  d_activations.fill_bytes_async(kPoisonByte, stream.handle());
  plan::launch_gemm_fp8(quantize, gemm, spec, params, activations, stream.handle(), device_multiprocessors());
  stream.synchronize();

  // The quantizer, bit for bit.
  const std::vector<std::uint8_t> workspace = d_activations.download_all<std::uint8_t>();
  std::size_t code_mismatches = 0, scale_mismatches = 0;
  for (std::size_t i = 0; i < quantized.codes.size(); ++i)
    code_mismatches += workspace[i] != quantized.codes[i];
  const auto* scales = reinterpret_cast<const unsigned char*>(activations.scales) -
                       reinterpret_cast<const unsigned char*>(activations.codes) + workspace.data();
  const int groups = (k + quantized.group - 1) / quantized.group;
  for (int g = 0; g < groups; ++g) {
    for (int row = 0; row < m; ++row) {
      float got = 0;
      std::memcpy(&got, scales + (std::size_t(g) * activations.scale_ld + row) * 4, 4);
      scale_mismatches += got != quantized.scales[std::size_t(g) * m + row];
    }
  }
  CHECK(code_mismatches == 0);
  CHECK(scale_mismatches == 0);

  // The GEMM: every element written, guard row and columns untouched, close to the reference.
  const std::vector<double> got = checked_output(d_c.download_all<std::uint16_t>(), m, n, ldc);
  const double error = reference::relative_l2_error(expected.data, got);
  std::printf(
      "fp8-activation gemm %-8s %-8s M %5d N %5d K %5d: codes %zu / scales %zu mismatches, relative L2 "
      "%.3e\n",
      std::string(plan::gemm_fp8_kernel_name(kernel)).c_str(),
      std::string(config::to_string(granularity)).c_str(), m, n, k, code_mismatches, scale_mismatches, error);
  INFO("relative L2 error " << error);
  // Same operands as the reference; fp32 partial sums per 128-wide K block, one output rounding to bf16.
  CHECK(error < 5e-3);
}

}  // namespace

// No tile multiples: M 37 / 300 / 1 / 130, N segments 256 | 128 | 40, K 2880 (22.5 blocks of 128), K 272;
// then K 112 and 208 (one and two blocks).
void check_fp8_gemm_shapes(plan::GemmFp8Kernel kernel) {
  std::uint64_t seed = 9001;
  for (auto granularity : {config::Fp8ScaleGranularity::tensor, config::Fp8ScaleGranularity::channel,
                           config::Fp8ScaleGranularity::block}) {
    check_fp8_gemm(kernel, granularity, 37, 2880, {256, 128, 40}, true, seed++);
    check_fp8_gemm(kernel, granularity, 300, 4096, {4096, 1024, 1024}, false, seed++);
    check_fp8_gemm(kernel, granularity, 1, 2880, {200}, true, seed++);
    check_fp8_gemm(kernel, granularity, 130, 272, {384}, false, seed++);
    // One K block and two (the sm_90a consumers' pipeline peels the last one or two blocks).
    check_fp8_gemm(kernel, granularity, 64, 112, {256}, true, seed++);
    check_fp8_gemm(kernel, granularity, 200, 208, {128, 64}, false, seed++);
  }
}

TEST_CASE("fp8-activation projection GEMM matches the reference", "[gpu][gemm][quantized][gemm_fp8]") {
  if (!fp8_gemm_here(plan::GemmFp8Kernel::wgmma)) {
    WARN("the wgmma fp8-activation GEMM needs sm_90a; skipped on " << device_arch().name());
    return;
  }
  check_fp8_gemm_shapes(plan::GemmFp8Kernel::wgmma);
}

// The sm_89 kernel (mma.sync m16n8k32 e4m3, gemm_sm89_fp8.cuh), forced on whatever device has fp8 tensor
// cores (on the H200 the plan would pick wgmma): the same cases, the same bound.
TEST_CASE("sm_89 fp8-activation GEMM (mma.sync e4m3) matches the reference",
          "[gpu][gemm][quantized][gemm_fp8][gemm_fp8_sm89]") {
  if (!fp8_gemm_here(plan::GemmFp8Kernel::mma_sync)) {
    WARN("the mma.sync fp8-activation GEMM needs sm_89 or newer; skipped on " << device_arch().name());
    return;
  }
  check_fp8_gemm_shapes(plan::GemmFp8Kernel::mma_sync);
}

// Quantizer + GEMM at 8192x6144x4096 with 128x128 block weight scales (Qwen3-8B-FP8's QKV at 8k tokens).
// Median of 20 CUDA-event timings after 5 warm-ups; the GEMM alone is timed too. Anchor:
// torch._scaled_mm row-wise ~1190 TFLOP/s on the H200. Run: test_gpu "[.gemm_fp8_speed]".
TEST_CASE("fp8-activation GEMM speed at 8192x6144x4096", "[.gemm_fp8_speed][gpu][gemm]") {
  if (!fp8_gemm_here(plan::GemmFp8Kernel::wgmma)) {
    WARN("fp8-activation GEMM needs sm_90a; skipped");
    return;
  }
  constexpr int m = 8192, n = 6144, k = 4096;
  gpu().context.make_current();
  std::mt19937_64 rng(12);
  const driver::DeviceBuffer d_a =
      driver::DeviceBuffer::from_host(random_bf16(std::size_t(m) * k, rng, 0.1, 1.0));
  std::vector<std::uint8_t> codes(std::size_t(n) * k);
  for (auto& code : codes)
    code = static_cast<std::uint8_t>(rng() % 0x7E) | static_cast<std::uint8_t>(rng() & 0x80);
  const driver::DeviceBuffer d_w = driver::DeviceBuffer::from_host(codes);
  const std::vector<float> block_scales(std::size_t(n / 128) * (k / 128), 1.0f / 4096);
  const driver::DeviceBuffer d_scales = driver::DeviceBuffer::from_host(block_scales);
  GemmParams params{};
  params.a = d_a.data<const bf16_bits>();
  params.m = m;
  params.n = n;
  params.k = k;
  params.lda = k;
  params.ldc = n;
  const int bounds[] = {0, 4096, 5120, 6144};
  for (int s = 0; s < 3; ++s) {
    params.segments[s] = {
        reinterpret_cast<const bf16_bits*>(d_w.data<const std::uint8_t>() + std::size_t(bounds[s]) * k),
        nullptr,
        bounds[s],
        bounds[s + 1],
        d_scales.data<const float>() + std::size_t(bounds[s] / 128) * (k / 128),
        nullptr};
  }
  plan::GemmFp8Spec spec;
  spec.segments = 3;
  spec.granularity = config::Fp8ScaleGranularity::block;
  driver::DeviceBuffer d_c(std::size_t(m) * n * 2);
  driver::DeviceBuffer d_activations(plan::fp8_activation_bytes(m, k));
  const plan::Fp8ActivationBuffers activations =
      plan::fp8_activation_buffers(d_activations.data<void>(), m, k);
  params.c = d_c.data<bf16_bits>();
  driver::Stream stream = driver::Stream::create();
  gpu().context.synchronize();
  d_c.fill_bytes_async(kPoisonByte, stream.handle());
  // Named sources: GCC 13 flags a reference returned for a temporary argument (the kernels live in a map).
  const compiler::KernelSource quantize_source = plan::Fp8QuantizeSpec{}.source();
  const compiler::KernelSource gemm_source = spec.source();
  const driver::Function& quantize = kernel_function(quantize_source, 0);
  const driver::Function& gemm = kernel_function(gemm_source, spec.dynamic_shared_bytes());
  const int sms = device_multiprocessors();
  const auto time_ms = [&](const auto& enqueue) {
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
    return double(milliseconds[10]);
  };
  const double total_ms = time_ms(
      [&] { plan::launch_gemm_fp8(quantize, gemm, spec, params, activations, stream.handle(), sms); });
  const double gemm_ms = time_ms([&] {
    driver::launch(gemm, spec.launch_shape(m, n, sms), stream.handle(),
                   plan::make_gemm_sm90_fp8_params(spec, params, activations));
  });
  stream.synchronize();
  const std::vector<std::uint16_t> output = d_c.download_all<std::uint16_t>();
  const std::size_t unwritten = std::size_t(std::count(output.begin(), output.end(), kPoisonBits));
  std::size_t not_finite = 0;
  for (std::uint16_t bits : output) not_finite += !std::isfinite(core::bf16_to_float(bits));
  const double flops = 2.0 * m * n * double(k);
  std::printf(
      "\nfp8-activation gemm 8192 6144 4096 block scales: quantize+gemm %.4f ms (%.1f TFLOP/s), gemm "
      "%.4f ms (%.1f TFLOP/s); anchor torch._scaled_mm row-wise ~1190; unwritten %zu\n",
      total_ms, flops / (total_ms * 1e-3) / 1e12, gemm_ms, flops / (gemm_ms * 1e-3) / 1e12, unwritten);
  CHECK(unwritten == 0);
  CHECK(not_finite == 0);
  CHECK(gemm_ms > 0);
}
