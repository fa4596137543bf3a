#include "gpu_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "config/parse.hpp"
#include "core/bf16.hpp"
#include "driver/cuda_api.hpp"
#include "driver/device.hpp"
#include "io/random_projection.hpp"
#include "reference/dequantize.hpp"
#include "support/catch.hpp"

// Exit 77 (CTest: skipped) before any test runs when no CUDA device is usable.
bool attnplan_tests_device_available() {
  std::string reason;
  if (attnplan::driver::device_available(&reason)) return true;
  std::fprintf(stderr, "GPU tests skipped: %s\n", reason.c_str());
  return false;
}

namespace attnplan::gpu_testing {

namespace {
// ATTNPLAN_CACHE_DIR set: the tests use that cache (from_environment read it), so repeated runs and the
// compute-sanitizer tools (tools/gpu_suite.sh, tools/sanitize.sh) compile each kernel once. Unset: a
// private temporary cache, so a run never reads stale entries from, or fills, the user's own cache.
RuntimeOptions options_for(const std::filesystem::path& private_cache_dir) {
  RuntimeOptions options = RuntimeOptions::from_environment();
  const char* shared_cache_dir = std::getenv("ATTNPLAN_CACHE_DIR");
  if (shared_cache_dir == nullptr || *shared_cache_dir == '\0') options.cache_dir = private_cache_dir;
  return options;
}
}  // namespace

Gpu::Gpu() : runtime(options_for(cache_dir.path())), context(runtime.options().device) {
  context.make_current();
}

plan::PrefillPlan Gpu::load(const config::AttentionConfig& config) {
  context.make_current();
  return runtime.load(runtime.compile(config));
}

Gpu& gpu() {
  static Gpu instance;
  instance.context.make_current();
  return instance;
}

const driver::Function& kernel_function(const compiler::KernelSource& source, int shared_bytes) {
  struct Loaded {
    driver::Module module;
    driver::Function function;
  };
  static std::map<std::string, std::unique_ptr<Loaded>> loaded;
  const std::string key = source.render_stub();
  auto found = loaded.find(key);
  if (found == loaded.end()) {
    const compiler::CompiledKernel kernel =
        gpu().runtime.compiler().compile(source, gpu().runtime.compile_options(device_arch()));
    driver::Module module = driver::Module::load(kernel.cubin);
    driver::Function function = module.function(kernel.lowered_name);
    if (shared_bytes > 0) function.set_max_dynamic_shared_bytes(shared_bytes);
    found = loaded.emplace(key, std::make_unique<Loaded>(Loaded{std::move(module), function})).first;
  }
  return found->second->function;
}

int device_multiprocessors() {
  return driver::query_device(gpu().context.ordinal()).multiprocessors;
}

config::Arch device_arch() {
  const std::optional<config::Arch> arch =
      config::parse_arch(driver::query_device(gpu().context.ordinal()).arch_name());
  REQUIRE(arch.has_value());
  return *arch;
}

config::AttentionConfig make_config(int hidden_size, int query_heads, int kv_heads, int head_dim,
                                    int value_head_dim, int block_size) {
  nlohmann::json json = {{"schema", "attnplan/v1"},
                         {"hidden_size", hidden_size},
                         {"query_heads", query_heads},
                         {"kv_heads", kv_heads},
                         {"head_dim", head_dim},
                         {"value_head_dim", value_head_dim},
                         {"kv_cache", {{"block_size", block_size}}}};
  return config::parse(json);
}

config::AttentionConfig config_from(nlohmann::json patch) {
  nlohmann::json json = {{"schema", "attnplan/v1"}, {"hidden_size", 512}, {"query_heads", 8},
                         {"kv_heads", 2},           {"head_dim", 64},     {"max_tokens", 4096}};
  if (!patch.is_null()) json.merge_patch(patch);  // `{}` converts to null, which would replace everything
  return config::parse(json);
}

std::vector<std::uint16_t> random_bf16(std::size_t count, std::mt19937_64& rng, double mean, double stddev) {
  std::normal_distribution<double> normal(mean, stddev);
  std::vector<std::uint16_t> bits(count);
  for (auto& value : bits) value = core::double_to_bf16(normal(rng));
  return bits;
}

driver::DeviceBuffer upload_with_nan_tail(const std::vector<std::uint16_t>& bits, std::size_t tail) {
  std::vector<std::uint16_t> padded = bits;
  padded.resize(bits.size() + tail, kPoisonBits);
  return driver::DeviceBuffer::from_host(padded);
}

std::vector<double> checked_output(const std::vector<std::uint16_t>& output, int m, int n, long long ldc) {
  std::vector<double> got(std::size_t(m) * n);
  std::size_t unwritten = 0, guard_touched = 0;
  for (int row = 0; row <= m; ++row) {
    for (long long col = 0; col < ldc; ++col) {
      const std::uint16_t bits = output[std::size_t(row * ldc + col)];
      if (row < m && col < n) {
        unwritten += bits == kPoisonBits;
        got[std::size_t(row) * n + std::size_t(col)] = core::bf16_to_float(bits);
      } else {
        guard_touched += bits != kPoisonBits;
      }
    }
  }
  CHECK(unwritten == 0);
  CHECK(guard_touched == 0);
  return got;
}

namespace {

// The values of a scale tensor (any float dtype) as f32 bytes.
std::vector<std::uint8_t> f32_bytes(const io::HostTensor& tensor) {
  const std::vector<double> values = io::to_doubles(tensor);
  std::vector<std::uint8_t> bytes(values.size() * 4);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float value = static_cast<float>(values[i]);
    std::memcpy(bytes.data() + 4 * i, &value, 4);
  }
  return bytes;
}

}  // namespace

QuantizedSegments upload_quantized_segments(const config::WeightEncoding& weights, int k,
                                            const std::vector<int>& widths,
                                            const std::vector<std::uint16_t>& bias_bits, std::uint64_t seed,
                                            GemmParams& params) {
  int n = 0;
  for (int width : widths) n += width;
  QuantizedSegments out{{}, reference::Tensor({n, k}), std::vector<double>(bias_bits.empty() ? 0 : n, 0.0)};
  const auto hold_bytes = [&](const std::vector<std::uint8_t>& bytes) {
    std::vector<std::uint8_t> padded = bytes;
    padded.resize(bytes.size() + 64, 0xFF);  // NaN / garbage past the end
    out.buffers.push_back(driver::DeviceBuffer::from_host(padded));
    return out.buffers.back().data<const void>();
  };
  const bool integer = weights.format == config::WeightFormat::packed_integer;
  const bool f32_scales = integer || weights.format == config::WeightFormat::affine;
  int n_begin = 0;
  for (std::size_t s = 0; s < widths.size(); ++s) {
    const io::RandomProjection part =
        io::random_projection(weights, widths[s], k, 1.0 / std::sqrt(double(k)), seed * 7 + s);
    const reference::Tensor dequantized =
        reference::dequantize(weights, part.weight, part.quant, widths[s], k);
    std::copy(dequantized.data.begin(), dequantized.data.end(),
              out.weight.data.begin() + std::ptrdiff_t(n_begin) * k);
    GemmSegment& segment = params.segments[s];
    segment.weight = static_cast<const bf16_bits*>(hold_bytes(part.weight.bytes));
    segment.scales = hold_bytes(f32_scales ? f32_bytes(*part.quant.scales) : part.quant.scales->bytes);
    if (part.quant.zeros)
      segment.zeros = hold_bytes(integer ? part.quant.zeros->bytes : f32_bytes(*part.quant.zeros));
    if (part.quant.g_idx) segment.g_idx = static_cast<const int*>(hold_bytes(part.quant.g_idx->bytes));
    if (part.quant.scale_2)
      segment.scale_2 = static_cast<const float*>(hold_bytes(part.quant.scale_2->bytes));
    segment.n_begin = n_begin;
    segment.n_end = n_begin + widths[s];
    if (!bias_bits.empty()) {
      out.buffers.push_back(
          upload_with_nan_tail({bias_bits.begin() + n_begin, bias_bits.begin() + segment.n_end}, 8));
      segment.bias = out.buffers.back().data<const bf16_bits>();
      for (int j = n_begin; j < segment.n_end; ++j) out.bias[j] = core::bf16_to_float(bias_bits[j]);
    }
    n_begin = segment.n_end;
  }
  return out;
}

DeviceCase::DeviceCase(const plan::PrefillPlan& plan, const check::LayerCase& layer)
    : weights(check::upload_weights(layer.config, layer.weights)),
      input(driver::DeviceBuffer::from_host(layer.input)),
      output(std::size_t(layer.num_tokens()) * layer.config.hidden_size * 2),
      keys(driver::DeviceBuffer::from_host(layer.key_cache)),
      values(driver::DeviceBuffer::from_host(layer.value_cache)),
      workspace(plan.workspace_bytes(layer.num_tokens())),
      batch(layer.batch, layer.spans, layer.config.bidirectional_spans) {
  args.input = input.data<const void>();
  args.output = output.data<void>();
  args.weights = weights.view;
  args.cache = {keys.data<void>(), values.data<void>(), layer.num_blocks};
  args.batch = batch.description();
  args.workspace = workspace.data<void>();
  args.workspace_bytes = workspace.size_bytes();
  // Poisoned, as an engine's reused memory would be: every stage must write what it reads (the attention
  // kernel's item counter, zeroed by the KV store kernel, among them; a counter left at the poison would
  // end every CTA's walk after its first item, and the checks of unwritten output rows catch that).
  workspace.fill_bytes(0xA5);
  driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");  // pageable uploads are done
}

}  // namespace attnplan::gpu_testing
