// The QKV postprocess kernel (per-head norms, spec section 3; RoPE, section 4) against the double-precision
// reference, in place on fused QKV rows with guard columns: every changed element within tolerance, every
// element neither step changes bit-identical, every guard untouched.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnplan/qkv_postprocess_params.h"
#include "config/parse.hpp"
#include "core/bf16.hpp"
#include "driver/event.hpp"
#include "driver/launch.hpp"
#include "driver/memory.hpp"
#include "driver/module.hpp"
#include "driver/stream.hpp"
#include "gpu_support.hpp"
#include "plan/qkv_postprocess_spec.hpp"
#include "reference/batch.hpp"
#include "reference/compare.hpp"
#include "reference/layer.hpp"
#include "reference/rmsnorm.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::gpu_testing;

namespace {

enum class Scaling { none, linear, llama3, yarn };

struct Case {
  std::string label;
  int query_heads;
  int kv_heads;
  int head_dim;
  int value_head_dim;
  int rotary_offset;
  int rotary_dim;   // 0: no RoPE
  int pairing_dim;  // ignored when rotary_dim == 0
  Scaling scaling;
  bool query_norm;
  bool key_norm;
  bool value_norm;
  double weight_offset;
};

struct Sequence {
  int context_len;
  int chunk_len;
};

// Prefixes of 0, 5 and 131071 tokens (and one of half a million): angles up to ~5e5 rad at the fastest pair.
// An empty sequence in the middle exercises the binary search over query_starts. 33 tokens in all.
const std::vector<Sequence> kSequences = {{0, 8}, {5, 13}, {0, 0}, {131071, 9}, {524287, 3}};

config::AttentionConfig config_for(const Case& c) {
  nlohmann::json rotary = {{"offset", c.rotary_offset}, {"dim", c.rotary_dim}, {"theta", 10000.0}};
  if (c.rotary_dim > 0) rotary["pairing_dim"] = c.pairing_dim;
  switch (c.scaling) {
    case Scaling::none:
      break;
    case Scaling::linear:  // Gemma 3 global layers
      rotary["theta"] = 1e6;
      rotary["scaling"] = {{"type", "linear"}, {"factor", 8.0}};
      break;
    case Scaling::llama3:  // Llama-3.1
      rotary["theta"] = 5e5;
      rotary["scaling"] = {{"type", "llama3"},
                           {"factor", 8.0},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position", 8192}};
      break;
    case Scaling::yarn:  // gpt-oss; attention_factor left to its default 0.1 ln 32 + 1
      rotary["theta"] = 150000.0;
      rotary["scaling"] = {{"type", "yarn"},    {"factor", 32.0},   {"original_max_position", 4096},
                           {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"truncate", false}};
      break;
  }
  nlohmann::json json = {{"schema", "attnplan/v1"},
                         {"hidden_size", c.query_heads * c.head_dim},
                         {"query_heads", c.query_heads},
                         {"kv_heads", c.kv_heads},
                         {"head_dim", c.head_dim},
                         {"value_head_dim", c.value_head_dim},
                         {"qkv_norm",
                          {{"query", c.query_norm},
                           {"key", c.key_norm},
                           {"value", c.value_norm},
                           {"weight_offset", c.weight_offset},
                           {"epsilon", 1e-6}}},
                         {"rotary", rotary}};
  return config::parse(json, c.label);
}

// Whether RoPE moves dimension `dim` of a head: pairs enumerated straight from spec section 4.
std::vector<bool> rotated_dims(const config::AttentionConfig& config) {
  std::vector<bool> rotated(config.head_dim, false);
  const int rotary_dim = config.rotary_dim();
  if (rotary_dim == 0) return rotated;
  const int half = config.pairing_dim() / 2;
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const int a = config.rotary.offset + config.pairing_dim() * (i / half) + i % half;
    rotated[a] = rotated[a + half] = true;
  }
  return rotated;
}

// Columns [column, column + heads * dim) of each token row, as [tokens, heads, dim].
reference::Tensor gather(const std::vector<std::uint16_t>& rows, long long row_stride, int tokens, int heads,
                         int dim, long long column) {
  reference::Tensor tensor({tokens, heads, dim});
  for (int t = 0; t < tokens; ++t) {
    for (long long i = 0; i < static_cast<long long>(heads) * dim; ++i) {
      tensor.data[t * heads * dim + i] = core::bf16_to_float(rows[t * row_stride + column + i]);
    }
  }
  return tensor;
}

// Compares one part (q, k or v) of the rows: elements the kernel changes against `expected`, the others
// bit for bit against the input.
struct PartCheck {
  double relative_l2 = 0;
  std::size_t changed_not_finite = 0;
  std::size_t unchanged_differs = 0;
  std::size_t changed = 0;
};
PartCheck check_part(const std::vector<std::uint16_t>& input, const std::vector<std::uint16_t>& output,
                     const reference::Tensor& expected, long long row_stride, long long column, bool normed,
                     const std::vector<bool>& rotated) {
  const int tokens = static_cast<int>(expected.extent(0));
  const int heads = static_cast<int>(expected.extent(1));
  const int dim = static_cast<int>(expected.extent(2));
  PartCheck check;
  std::vector<double> want, got;
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int d = 0; d < dim; ++d) {
        const long long index = t * row_stride + column + static_cast<long long>(h) * dim + d;
        if (normed || rotated[d]) {
          ++check.changed;
          const double value = core::bf16_to_float(output[index]);
          if (!std::isfinite(value)) ++check.changed_not_finite;
          want.push_back(expected(t, h, d));
          got.push_back(value);
        } else if (output[index] != input[index]) {
          ++check.unchanged_differs;
        }
      }
    }
  }
  check.relative_l2 = want.empty() ? 0.0 : reference::relative_l2_error(want, got);
  return check;
}

// The config's kernel, compiled for the device (no plan stage exists for it yet) and loaded.
struct LoadedKernel {
  plan::QkvPostprocessSpec spec;
  compiler::CompiledKernel compiled;
  driver::Module module;
  driver::Function function;
};
LoadedKernel load_kernel(const config::AttentionConfig& config) {
  Runtime& runtime = gpu().runtime;
  const plan::QkvPostprocessSpec spec = plan::QkvPostprocessSpec::from_config(config);
  compiler::CompiledKernel compiled =
      runtime.compiler().compile(spec.source(), runtime.compile_options(runtime.resolve_arch(config)));
  driver::Module module = driver::Module::load(compiled.cubin);
  driver::Function function = module.function(compiled.lowered_name);
  return {spec, std::move(compiled), std::move(module), function};
}

driver::LaunchShape launch_shape(const plan::QkvPostprocessSpec& spec, int tokens) {
  driver::LaunchShape shape;
  shape.grid.x = static_cast<unsigned>(tokens);
  shape.block.x = static_cast<unsigned>(spec.tiling.threads);
  return shape;
}

void check_qkv_postprocess(const Case& c, const std::vector<Sequence>& sequences, std::uint64_t seed) {
  const config::AttentionConfig config = config_for(c);
  const LoadedKernel loaded = load_kernel(config);
  const plan::QkvPostprocessSpec& spec = loaded.spec;
  INFO(c.label << ": " << spec.source().spec.dump());
  REQUIRE(spec.has_work());
  CHECK(loaded.compiled.resources.spill_bytes() == 0);
  Gpu& device = gpu();

  // The batch: query_starts / context_lens as the plan receives them.
  reference::Batch batch;
  batch.query_starts.push_back(0);
  for (const Sequence& s : sequences) {
    batch.context_lens.push_back(s.context_len);
    batch.query_starts.push_back(batch.query_starts.back() + s.chunk_len);
  }
  const int tokens = batch.query_starts.back();
  std::vector<std::int64_t> positions;
  for (const reference::TokenPosition& p : reference::token_positions(batch, tokens))
    positions.push_back(p.position);

  // Rows of [q | k | v | guard], plus one whole guard row after the last token. The guard columns start
  // poisoned (0xFFFF, a NaN) and must stay so.
  const long long width = spec.row_width();
  const long long row_stride = width + 2 * spec.row_alignment() + 8;
  std::mt19937_64 rng(seed);
  std::vector<std::uint16_t> input = random_bf16(std::size_t(tokens + 1) * row_stride, rng, 0.2, 1.5);
  for (int t = 0; t <= tokens; ++t) {
    for (long long i = 0; i < row_stride; ++i) {
      if (t == tokens || i >= width) input[t * row_stride + i] = kPoisonBits;
    }
  }
  const std::vector<std::uint16_t> query_weight =
      random_bf16(c.head_dim, rng, c.weight_offset == 0 ? 1.0 : 0.0, 0.5);
  const std::vector<std::uint16_t> key_weight =
      random_bf16(c.head_dim, rng, c.weight_offset == 0 ? 1.0 : 0.0, 0.5);
  const std::vector<double> frequencies = reference::rope_frequencies(config);
  const double attention_factor = reference::rope_attention_factor(config);

  driver::DeviceBuffer d_qkv = driver::DeviceBuffer::from_host(input);
  driver::DeviceBuffer d_query_weight = driver::DeviceBuffer::from_host(query_weight);
  driver::DeviceBuffer d_key_weight = driver::DeviceBuffer::from_host(key_weight);
  // A one-element table when RoPE is off, so the pointer is never null (the kernel does not read it).
  driver::DeviceBuffer d_frequencies =
      driver::DeviceBuffer::from_host(frequencies.empty() ? std::vector<double>{0.0} : frequencies);
  driver::DeviceBuffer d_query_starts = driver::DeviceBuffer::from_host(batch.query_starts);
  driver::DeviceBuffer d_context_lens = driver::DeviceBuffer::from_host(batch.context_lens);

  QkvPostprocessParams params{};
  params.qkv = d_qkv.data<bf16_bits>();
  params.q_norm_weight = d_query_weight.data<const bf16_bits>();
  params.k_norm_weight = d_key_weight.data<const bf16_bits>();
  params.frequencies = d_frequencies.data<const double>();
  params.query_starts = d_query_starts.data<const int>();
  params.context_lens = d_context_lens.data<const int>();
  params.qkv_row_stride = row_stride;
  params.num_tokens = tokens;
  params.num_seqs = batch.num_seqs();
  params.epsilon = static_cast<float>(config.qkv_norm_epsilon());
  params.attention_factor = static_cast<float>(attention_factor);

  driver::Stream stream = driver::Stream::create();
  device.context.synchronize();  // uploads from pageable memory may still be in flight on the legacy stream
  driver::launch(loaded.function, launch_shape(spec, tokens), stream.handle(), params);
  stream.synchronize();
  const std::vector<std::uint16_t> output = d_qkv.download_all<std::uint16_t>();

  // The reference: per-head norms, then RoPE, in double on the same bf16 inputs; no rounding in between
  // (the kernel keeps fp32 registers from load to store).
  const long long key_column = static_cast<long long>(c.query_heads) * c.head_dim;
  const long long value_column = key_column + static_cast<long long>(c.kv_heads) * c.head_dim;
  reference::Tensor q = gather(input, row_stride, tokens, c.query_heads, c.head_dim, 0);
  reference::Tensor k = gather(input, row_stride, tokens, c.kv_heads, c.head_dim, key_column);
  reference::Tensor v = gather(input, row_stride, tokens, c.kv_heads, c.value_head_dim, value_column);
  const double epsilon = config.qkv_norm_epsilon();
  if (c.query_norm) q = reference::rmsnorm(q, core::bf16_to_doubles(query_weight), epsilon, c.weight_offset);
  if (c.key_norm) k = reference::rmsnorm(k, core::bf16_to_doubles(key_weight), epsilon, c.weight_offset);
  if (c.value_norm) v = reference::rmsnorm(v, {}, epsilon);
  reference::apply_rope(q, positions, config);
  reference::apply_rope(k, positions, config);

  const std::vector<bool> rotated = rotated_dims(config);
  const std::vector<bool> value_rotated(c.value_head_dim, false);
  const PartCheck q_check = check_part(input, output, q, row_stride, 0, c.query_norm, rotated);
  const PartCheck k_check = check_part(input, output, k, row_stride, key_column, c.key_norm, rotated);
  const PartCheck v_check =
      check_part(input, output, v, row_stride, value_column, c.value_norm, value_rotated);
  std::size_t guard_touched = 0;
  for (std::size_t t = 0; t <= std::size_t(tokens); ++t) {
    for (long long i = 0; i < row_stride; ++i) {
      const std::size_t index = t * row_stride + i;
      if ((t == std::size_t(tokens) || i >= width) && output[index] != kPoisonBits) ++guard_touched;
    }
  }

  INFO("relative L2 q " << q_check.relative_l2 << " (" << q_check.changed << " changed), k "
                        << k_check.relative_l2 << " (" << k_check.changed << "), v " << v_check.relative_l2
                        << " (" << v_check.changed << "); " << loaded.compiled.resources.registers
                        << " registers");
  CHECK(guard_touched == 0);
  for (const PartCheck* part : {&q_check, &k_check, &v_check}) {
    CHECK(part->changed_not_finite == 0);
    CHECK(part->unchanged_differs == 0);
    CHECK(part->relative_l2 < 1e-2);
  }
}

}  // namespace

TEST_CASE("qkv postprocess matches the reference norms and RoPE", "[gpu][qkv_postprocess]") {
  // label, Hq, Hkv, D, Dv, offset, R, P2, scaling, q norm, k norm, v norm, weight offset
  const std::vector<Case> cases = {
      {"llama-3.1: R = P2 = D, llama3", 32, 8, 128, 128, 0, 128, 128, Scaling::llama3, false, false, false,
       0},
      {"qwen3: q/k norm (w), theta 1e6", 16, 4, 128, 128, 0, 128, 128, Scaling::none, true, true, false, 0},
      {"gemma 3: q/k norm (1 + w), linear x8", 16, 8, 128, 128, 0, 128, 128, Scaling::linear, true, true,
       false, 1},
      {"gpt-oss: D 64, yarn", 64, 8, 64, 64, 0, 64, 64, Scaling::yarn, false, false, false, 0},
      {"gpt-j: D 256, R 64, P2 2", 16, 16, 256, 256, 0, 64, 2, Scaling::none, false, false, false, 0},
      {"pythia: R = D / 4, P2 = R", 8, 8, 256, 256, 0, 64, 64, Scaling::none, true, false, false, 0},
      {"phi-4-mini: R 96 of 128", 24, 8, 128, 128, 0, 96, 96, Scaling::none, false, false, false, 0},
      {"pairs across the head: P2 = D > R", 8, 2, 128, 128, 0, 32, 128, Scaling::linear, false, true, false,
       1},
      {"offset rope: o 64, R 64, P2 2 of 192", 8, 4, 192, 192, 64, 64, 2, Scaling::yarn, true, true, false,
       0},
      {"MLA-style: o 128, R 64, P2 2 of 192, v norm", 8, 8, 192, 128, 128, 64, 2, Scaling::none, true, false,
       true, 1},
      {"element exchange: o 2, R 60, P2 20", 12, 4, 128, 128, 2, 60, 20, Scaling::llama3, false, true, true,
       0},
      {"element exchange: odd half, P2 6 of 64", 8, 1, 64, 64, 0, 6, 6, Scaling::none, true, true, false, 0},
      {"phi-2-like: D 80, R 32", 32, 32, 80, 80, 0, 32, 32, Scaling::none, true, true, false, 0},
      {"norms only: no RoPE, Dv 256 with v norm", 8, 2, 128, 256, 0, 0, 0, Scaling::none, true, true, true,
       1},
      {"v norm only", 4, 2, 64, 64, 0, 0, 0, Scaling::none, false, false, true, 0},
  };
  std::uint64_t seed = 97;
  for (const Case& c : cases) check_qkv_postprocess(c, kSequences, seed++);
}

TEST_CASE("qkv postprocess handles one token and one sequence", "[gpu][qkv_postprocess]") {
  const Case llama = {"one token", 32, 8, 128, 128, 0, 128, 128, Scaling::llama3, true, true, false, 0};
  check_qkv_postprocess(llama, {{0, 1}}, 5);
  check_qkv_postprocess(llama, {{131071, 1}}, 6);
}

// Not a correctness test (hidden: run with "[qkv_postprocess_benchmark]"): device time of a full
// 8192-token chunk, and the bandwidth it reaches on the bytes it must move.
TEST_CASE("qkv postprocess bandwidth", "[.][benchmark][qkv_postprocess_benchmark]") {
  const std::vector<Case> cases = {
      {"llama-3.1 (RoPE)", 32, 8, 128, 128, 0, 128, 128, Scaling::llama3, false, false, false, 0},
      {"qwen3-8b (q/k norm + RoPE)", 32, 8, 128, 128, 0, 128, 128, Scaling::none, true, true, false, 0},
      {"gpt-oss (D 64, yarn)", 64, 8, 64, 64, 0, 64, 64, Scaling::yarn, false, false, false, 0},
      {"gpt-j (R 64 of 256, P2 2)", 16, 16, 256, 256, 0, 64, 2, Scaling::none, false, false, false, 0},
  };
  constexpr int kTokens = 8192;
  constexpr int kRepeats = 20;
  for (const Case& c : cases) {
    const config::AttentionConfig config = config_for(c);
    const LoadedKernel loaded = load_kernel(config);
    const plan::QkvPostprocessSpec& spec = loaded.spec;
    std::mt19937_64 rng(3);
    const std::vector<std::uint16_t> rows = random_bf16(std::size_t(kTokens) * spec.row_width(), rng);
    const std::vector<std::uint16_t> weight = random_bf16(c.head_dim, rng, 1.0, 0.1);
    const std::vector<double> frequencies = reference::rope_frequencies(config);
    const std::vector<int> query_starts = {0, kTokens / 2, kTokens};
    const std::vector<int> context_lens = {0, 100000};
    driver::DeviceBuffer d_qkv = driver::DeviceBuffer::from_host(rows);
    driver::DeviceBuffer d_weight = driver::DeviceBuffer::from_host(weight);
    driver::DeviceBuffer d_frequencies = driver::DeviceBuffer::from_host(frequencies);
    driver::DeviceBuffer d_query_starts = driver::DeviceBuffer::from_host(query_starts);
    driver::DeviceBuffer d_context_lens = driver::DeviceBuffer::from_host(context_lens);
    QkvPostprocessParams params{};
    params.qkv = d_qkv.data<bf16_bits>();
    params.q_norm_weight = params.k_norm_weight = d_weight.data<const bf16_bits>();
    params.frequencies = d_frequencies.data<const double>();
    params.query_starts = d_query_starts.data<const int>();
    params.context_lens = d_context_lens.data<const int>();
    params.qkv_row_stride = spec.row_width();
    params.num_tokens = kTokens;
    params.num_seqs = 2;
    params.epsilon = 1e-6f;
    params.attention_factor = static_cast<float>(reference::rope_attention_factor(config));

    driver::Stream stream = driver::Stream::create();
    gpu().context.synchronize();
    const driver::LaunchShape shape = launch_shape(spec, kTokens);
    driver::launch(loaded.function, shape, stream.handle(), params);  // warm-up
    const driver::Event start = driver::Event::create(), stop = driver::Event::create();
    start.record(stream.handle());
    for (int i = 0; i < kRepeats; ++i) driver::launch(loaded.function, shape, stream.handle(), params);
    stop.record(stream.handle());
    const double microseconds = 1000.0 * driver::elapsed_ms(start, stop) / kRepeats;
    // What must move: whole rows when normalized, only the rotated dims otherwise (the kernel skips
    // vectors without one), each read and written once.
    const int dims_per_row = (c.query_norm || c.key_norm) ? c.head_dim : c.rotary_dim;
    const double bytes = 2.0 * 2.0 * kTokens * spec.head_rows() * dims_per_row;
    WARN(c.label << ": " << microseconds << " us per 8192 tokens, " << bytes / microseconds / 1e3
                 << " GB/s on the head rows, " << loaded.compiled.resources.registers << " registers, "
                 << spec.tiling.threads << " threads");
  }
}
