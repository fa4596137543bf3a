#include "gpu_support.hpp"

#include <cstdio>
#include <cstdlib>

#include "config/parse.hpp"
#include "core/bf16.hpp"
#include "driver/cuda_api.hpp"
#include "driver/device.hpp"

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

std::vector<double> to_doubles(const std::vector<std::uint16_t>& bits) {
  std::vector<double> values(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) values[i] = core::bf16_to_float(bits[i]);
  return values;
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
  driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");  // pageable uploads are done
}

}  // namespace attnplan::gpu_testing
