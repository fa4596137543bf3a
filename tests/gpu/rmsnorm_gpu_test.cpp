// The input RMSNorm kernel against the double-precision reference (spec section 1).
#include <cmath>

#include "core/bf16.hpp"
#include "driver/memory.hpp"
#include "driver/stream.hpp"
#include "gpu_support.hpp"
#include "reference/compare.hpp"
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
      reference::rmsnorm(reference::Tensor({c.num_tokens, c.hidden_size}, to_doubles(input)),
                         to_doubles(weight), c.epsilon, c.weight_offset);
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

}  // namespace

TEST_CASE("input RMSNorm matches the reference", "[gpu][rmsnorm]") {
  const std::vector<Case> cases = {
      {4096, 0.0, 1e-5, 37},   // Llama: 512 threads, one 16-byte vector each
      {5376, 1.0, 1e-6, 129},  // Gemma 3 27B: (1 + w)
      {2880, 0.0, 1e-5, 1},    // gpt-oss: one token
      {16384, 0.0, 1e-5, 70},  // two vectors per thread
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
