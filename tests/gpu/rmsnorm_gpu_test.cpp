// The input RMSNorm kernel against the double-precision reference (spec section 1), and its variant that
// also writes an fp8-activation projection's codes against the quantizer's rule, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16.hpp"
#include "driver/launch.hpp"
#include "driver/memory.hpp"
#include "driver/stream.hpp"
#include "gpu_support.hpp"
#include "plan/gemm_fp8.hpp"
#include "plan/heuristics.hpp"
#include "plan/kernel_specs.hpp"
#include "reference/bf16.hpp"
#include "reference/compare.hpp"
#include "reference/fp8_activation.hpp"
#include "reference/rmsnorm.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::gpu_testing;

namespace {

struct Case {
  int hidden_size;
  double weight_offset;
  double epsilon;
  int num_tokens;
};

void check_rmsnorm(const Case& c, std::uint64_t seed) {
  INFO("hidden " << c.hidden_size << ", offset " << c.weight_offset << ", tokens " << c.num_tokens);
  config::AttentionConfig config = make_config(c.hidden_size, 8, 8, 64, 64, 16);
  config.input_norm.weight_offset = c.weight_offset;
  config.input_norm.epsilon = c.epsilon;
  plan::PrefillPlan plan = gpu().load(config);

  std::mt19937_64 rng(seed);
  // Activations with a non-zero mean and large spread, weights around 1 (or around 0 for Gemma's 1 + w).
  const std::vector<std::uint16_t> input =
      random_bf16(std::size_t(c.num_tokens) * c.hidden_size, rng, 0.3, 2.0);
  const std::vector<std::uint16_t> weight =
      random_bf16(c.hidden_size, rng, c.weight_offset == 0 ? 1.0 : 0.0, 0.5);

  // Two guard rows after the output: the kernel must write every row it owns and nothing past them.
  const std::size_t out_elements = std::size_t(c.num_tokens + 2) * c.hidden_size;
  driver::DeviceBuffer d_input = driver::DeviceBuffer::from_host(input);
  driver::DeviceBuffer d_weight = driver::DeviceBuffer::from_host(weight);
  driver::DeviceBuffer d_output(out_elements * 2);
  driver::Stream stream = driver::Stream::create();
  d_output.fill_bytes_async(kPoisonByte, stream.handle());  // on the same (non-blocking) stream as the kernel
  plan::InputNormArgs args;
  args.input = d_input.data<const void>();
  args.weight = d_weight.data<const void>();
  args.output = d_output.data<void>();
  args.num_tokens = c.num_tokens;
  gpu().context.synchronize();  // uploads from pageable memory may still be in flight on the legacy stream
  plan.launch_input_norm(args, stream.handle());
  stream.synchronize();
  const std::vector<std::uint16_t> output = d_output.download_all<std::uint16_t>();

  const reference::Tensor expected =
      reference::rmsnorm(reference::tensor_from_bf16(input, {c.num_tokens, c.hidden_size}),
                         core::bf16_to_doubles(weight), c.epsilon, c.weight_offset);
  std::vector<double> got(expected.data.size());
  std::size_t unwritten = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (output[i] == kPoisonBits) ++unwritten;
    got[i] = core::bf16_to_float(output[i]);
  }
  CHECK(unwritten == 0);
  std::size_t guard_touched = 0;
  for (std::size_t i = got.size(); i < output.size(); ++i) guard_touched += output[i] != kPoisonBits;
  CHECK(guard_touched == 0);
  const double error = reference::relative_l2_error(expected.data, got);
  INFO("relative L2 error " << error);
  // One bf16 rounding of the result: about 2^-9 relative per element.
  CHECK(error < 5e-3);
}

// The norm with fp8 codes (RmsNormSpec::fp8_codes, the plans with an fp8-activation q|k|v projection),
// launched on its own: with the bf16 rows and without them (what execute does unobserved). The rows match
// the reference as the plain norm's do; codes and scales are reference::quantize_activations_fp8 of those
// rows bit for bit (the quantizer's rule, so the GEMM reads what the quantizer would have written); nothing
// past the codes, the scales or (without rows) in the rows buffer is written. Per token and group of 128
// channels, and with one scale per token.
void check_rmsnorm_fp8_codes(const Case& c, config::Fp8ActivationScales scale_mode, std::uint64_t seed) {
  INFO("fp8 codes: hidden " << c.hidden_size << ", offset " << c.weight_offset << ", tokens " << c.num_tokens
                            << ", scales per " << config::to_string(scale_mode));
  plan::RmsNormSpec spec;
  spec.hidden_size = c.hidden_size;
  spec.unit_offset = c.weight_offset != 0;
  spec.fp8_codes = scale_mode;
  spec.tiling = plan::choose_rmsnorm_tiling(c.hidden_size);
  const compiler::KernelSource source = spec.source();
  const driver::Function& norm = kernel_function(source);

  std::mt19937_64 rng(seed);
  const std::vector<std::uint16_t> input =
      random_bf16(std::size_t(c.num_tokens) * c.hidden_size, rng, 0.3, 2.0);
  const std::vector<std::uint16_t> weight =
      random_bf16(c.hidden_size, rng, c.weight_offset == 0 ? 1.0 : 0.0, 0.5);
  const std::size_t elements = std::size_t(c.num_tokens) * c.hidden_size;
  // The workspace region as the plan lays it out (codes, then scales), one guard byte block after it.
  const std::size_t region = plan::fp8_activation_bytes(c.num_tokens, c.hidden_size);
  driver::DeviceBuffer d_input = driver::DeviceBuffer::from_host(input);
  driver::DeviceBuffer d_weight = driver::DeviceBuffer::from_host(weight);
  driver::DeviceBuffer d_output(elements * 2);
  driver::DeviceBuffer d_codes(region + 256);
  const plan::Fp8ActivationBuffers buffers =
      plan::fp8_activation_buffers(d_codes.data<void>(), c.num_tokens, c.hidden_size);

  RmsNormParams params{};
  params.input = d_input.data<const bf16_bits>();
  params.weight = d_weight.data<const bf16_bits>();
  params.num_tokens = c.num_tokens;
  params.epsilon = static_cast<float>(c.epsilon);
  params.codes = buffers.codes;
  params.scales = buffers.scales;
  params.ld_codes = c.hidden_size;
  params.scale_ld = buffers.scale_ld;
  const driver::LaunchShape shape{{unsigned(c.num_tokens), 1, 1}, {unsigned(spec.tiling.threads), 1, 1}, 0};
  driver::Stream stream = driver::Stream::create();
  gpu().context.synchronize();  // pageable uploads

  // Without the rows (as execute runs unobserved), then with them.
  std::vector<std::uint8_t> codes_alone;
  for (const bool rows : {false, true}) {
    INFO((rows ? "with" : "without") << " the bf16 rows");
    d_output.fill_bytes_async(kPoisonByte, stream.handle());
    d_codes.fill_bytes_async(kPoisonByte, stream.handle());
    params.output = rows ? d_output.data<bf16_bits>() : nullptr;
    driver::launch(norm, shape, stream.handle(), params);
    stream.synchronize();
    const std::vector<std::uint16_t> output = d_output.download_all<std::uint16_t>();
    const std::vector<std::uint8_t> workspace = d_codes.download_all<std::uint8_t>();
    std::size_t guard_touched = 0;
    for (std::size_t i = region; i < workspace.size(); ++i) guard_touched += workspace[i] != kPoisonByte;
    CHECK(guard_touched == 0);
    if (!rows) {
      CHECK(std::count(output.begin(), output.end(), kPoisonBits) == std::ptrdiff_t(elements));
      codes_alone = workspace;
      continue;
    }
    CHECK(workspace == codes_alone);  // the rows change nothing in the codes

    const reference::Tensor expected =
        reference::rmsnorm(reference::tensor_from_bf16(input, {c.num_tokens, c.hidden_size}),
                           core::bf16_to_doubles(weight), c.epsilon, c.weight_offset);
    CHECK(std::count(output.begin(), output.end(), kPoisonBits) == 0);
    const double error = reference::relative_l2_error(expected.data, core::bf16_to_doubles(output));
    INFO("relative L2 error " << error);
    CHECK(error < 5e-3);

    const reference::Fp8Activations quantized =
        reference::quantize_activations_fp8(output, c.num_tokens, c.hidden_size, scale_mode);
    std::size_t code_mismatches = 0, scale_mismatches = 0;
    for (std::size_t i = 0; i < elements; ++i) code_mismatches += workspace[i] != quantized.codes[i];
    const unsigned char* scales = workspace.data() + (reinterpret_cast<const unsigned char*>(buffers.scales) -
                                                      reinterpret_cast<const unsigned char*>(buffers.codes));
    const int groups = (c.hidden_size + quantized.group - 1) / quantized.group;
    for (int g = 0; g < groups; ++g) {
      for (int t = 0; t < c.num_tokens; ++t) {
        float got = 0;
        std::memcpy(&got, scales + (std::size_t(g) * buffers.scale_ld + t) * 4, 4);
        scale_mismatches += got != quantized.scales[std::size_t(g) * c.num_tokens + t];
      }
    }
    CHECK(code_mismatches == 0);
    CHECK(scale_mismatches == 0);
  }
}

}  // namespace

TEST_CASE("input RMSNorm with fp8 codes writes the quantizer's codes, bit for bit",
          "[gpu][rmsnorm][fp8_activation]") {
  const std::vector<Case> cases = {
      {4096, 0.0, 1e-5, 37},   // Llama: 128 threads of 4 vectors, 32 groups of 16 lanes
      {5376, 1.0, 1e-6, 129},  // Gemma 3 27B: (1 + w), 42 groups, 192 threads (the last pass 96 of them)
      {2880, 0.0, 1e-5, 5},    // gpt-oss: 128 threads for 360 vectors, a last group of 64 channels
      {16384, 0.0, 1e-5, 70},  // 512 threads of 4 vectors
      {65536, 0.0, 1e-5, 3},   // 1024 threads of 8 vectors
      {208, 0.0, 1e-1, 513},   // tiny rows: one full group and one of 80 channels
  };
  std::uint64_t seed = 4321;
  for (const Case& c : cases) {
    for (const config::Fp8ActivationScales scale_mode :
         {config::Fp8ActivationScales::token_group, config::Fp8ActivationScales::token}) {
      check_rmsnorm_fp8_codes(c, scale_mode, seed++);
    }
  }
}

TEST_CASE("input RMSNorm matches the reference", "[gpu][rmsnorm]") {
  const std::vector<Case> cases = {
      {4096, 0.0, 1e-5, 37},   // Llama: 128 threads, four 16-byte vectors each
      {5376, 1.0, 1e-6, 129},  // Gemma 3 27B: (1 + w)
      {2880, 0.0, 1e-5, 1},    // gpt-oss: one token
      {16384, 0.0, 1e-5, 70},  // 512 threads of 4 vectors
      {65536, 0.0, 1e-5, 3},   // 1024 threads of 8 vectors
      {200, 0.0, 1e-1, 513},   // tiny rows, a large epsilon that matters
  };
  std::uint64_t seed = 1234;
  for (const Case& c : cases) check_rmsnorm(c, seed++);
}

TEST_CASE("input RMSNorm rejects arguments that contradict the plan", "[gpu][rmsnorm]") {
  plan::PrefillPlan plan = gpu().load(make_config(4096, 32, 8, 128, 128, 16));
  driver::DeviceBuffer buffer(4096 * 2 * 4);
  plan::InputNormArgs args;
  args.input = buffer.data<const void>();
  args.weight = buffer.data<const void>();
  args.output = buffer.data<void>();
  args.num_tokens = plan.compiled().config.max_tokens + 1;
  CHECK_THROWS_AS(plan.launch_input_norm(args, nullptr), Error);
  args.num_tokens = 2;
  args.output = nullptr;
  CHECK_THROWS_AS(plan.launch_input_norm(args, nullptr), Error);
  args.output = static_cast<char*>(buffer.data<void>()) + 2;  // not 16-byte aligned
  CHECK_THROWS_AS(plan.launch_input_norm(args, nullptr), Error);
}
