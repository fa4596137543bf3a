#include "plan/prefill_plan.hpp"

#include <fmt/format.h>

#include <cstdint>

#include "attnplan/params.h"
#include "core/error.hpp"
#include "driver/context.hpp"
#include "driver/device.hpp"
#include "driver/launch.hpp"
#include "driver/module.hpp"
#include "plan/runtime.hpp"

namespace attnplan::plan {

struct PrefillPlan::Loaded {
  driver::Context context;
  std::vector<driver::Module> modules;  // owns the functions below
  driver::Function input_norm;
  driver::Function kv_store;
};

namespace {

void require(bool condition, const std::string& message) {
  if (!condition) throw Error(Stage::input, message);
}

void require_pointer(const void* pointer, const char* field, std::size_t alignment) {
  require(pointer != nullptr, fmt::format("{}: null device pointer", field));
  require(reinterpret_cast<std::uintptr_t>(pointer) % alignment == 0,
          fmt::format("{}: device pointer {} is not aligned to {} bytes", field, pointer, alignment));
}

int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

}  // namespace

PrefillPlan::PrefillPlan(CompiledPlan compiled, std::unique_ptr<Loaded> loaded)
    : compiled_(std::move(compiled)), loaded_(std::move(loaded)) {}
PrefillPlan::PrefillPlan(PrefillPlan&&) noexcept = default;
PrefillPlan& PrefillPlan::operator=(PrefillPlan&&) noexcept = default;
PrefillPlan::~PrefillPlan() = default;

std::size_t PrefillPlan::workspace_bytes(int /*max_tokens*/) const {
  return 0;
}

void PrefillPlan::launch_input_norm(const InputNormArgs& args, CUstream stream) const {
  const config::AttentionConfig& config = compiled_.config;
  const RmsNormSpec& spec = compiled_.kernels_planned.input_norm;
  const std::size_t alignment = 2 * spec.tiling.vector;  // the kernel's vector access width in bytes
  require(args.num_tokens >= 0 && args.num_tokens <= config.max_tokens,
          fmt::format("num_tokens: {} is outside [0, max_tokens = {}]", args.num_tokens, config.max_tokens));
  if (args.num_tokens == 0) return;
  require_pointer(args.input, "input", alignment);
  require_pointer(args.weight, "weight", alignment);
  require_pointer(args.output, "output", alignment);

  RmsNormParams params{};
  params.input = static_cast<const bf16_bits*>(args.input);
  params.weight = static_cast<const bf16_bits*>(args.weight);
  params.output = static_cast<bf16_bits*>(args.output);
  params.num_tokens = args.num_tokens;
  params.epsilon = static_cast<float>(config.input_norm.epsilon);

  loaded_->context.make_current();
  driver::launch(
      loaded_->input_norm,
      driver::LaunchShape{{unsigned(args.num_tokens), 1, 1}, {unsigned(spec.tiling.threads), 1, 1}, 0},
      stream, params);
}

void PrefillPlan::launch_kv_store(const KvStoreArgs& args, CUstream stream) const {
  const config::AttentionConfig& config = compiled_.config;
  const KvStoreSpec& spec = compiled_.kernels_planned.kv_store;
  const BatchDescription& batch = args.batch;
  require(batch.num_tokens >= 0 && batch.num_tokens <= config.max_tokens,
          fmt::format("batch.num_tokens: {} is outside [0, max_tokens = {}]", batch.num_tokens,
                      config.max_tokens));
  if (batch.num_tokens == 0) return;
  require(batch.num_seqs >= 1, fmt::format("batch.num_seqs: {} must be at least 1", batch.num_seqs));
  require(batch.max_blocks_per_seq >= 1,
          fmt::format("batch.max_blocks_per_seq: {} must be at least 1", batch.max_blocks_per_seq));
  require(args.cache.num_blocks >= 1,
          fmt::format("cache.num_blocks: {} must be at least 1", args.cache.num_blocks));
  require_pointer(batch.query_starts, "batch.query_starts", 4);
  require_pointer(batch.context_lens, "batch.context_lens", 4);
  require_pointer(batch.block_tables, "batch.block_tables", 4);

  const long long key_width = static_cast<long long>(spec.kv_heads) * spec.head_dim;
  const long long value_width = static_cast<long long>(spec.kv_heads) * spec.value_head_dim;
  const long long key_stride = args.key_row_stride != 0 ? args.key_row_stride : key_width;
  const long long value_stride = args.value_row_stride != 0 ? args.value_row_stride : value_width;
  const int key_vector = vector_width_for(spec.head_dim);
  const int value_vector = vector_width_for(spec.value_head_dim);
  require(key_stride >= key_width && key_stride % key_vector == 0,
          fmt::format("key_row_stride: {} must be >= kv_heads * head_dim = {} and a multiple of {}",
                      key_stride, key_width, key_vector));
  require(value_stride >= value_width && value_stride % value_vector == 0,
          fmt::format("value_row_stride: {} must be >= kv_heads * value_head_dim = {} and a multiple of {}",
                      value_stride, value_width, value_vector));
  require_pointer(args.key, "key", 2 * key_vector);
  require_pointer(args.value, "value", 2 * value_vector);
  require_pointer(args.cache.key_cache, "cache.key_cache", 2 * key_vector);
  require_pointer(args.cache.value_cache, "cache.value_cache", 2 * value_vector);

  KvStoreParams params{};
  params.key = static_cast<const bf16_bits*>(args.key);
  params.value = static_cast<const bf16_bits*>(args.value);
  params.key_cache = static_cast<bf16_bits*>(args.cache.key_cache);
  params.value_cache = static_cast<bf16_bits*>(args.cache.value_cache);
  params.block_tables = batch.block_tables;
  params.query_starts = batch.query_starts;
  params.context_lens = batch.context_lens;
  params.key_row_stride = key_stride;
  params.value_row_stride = value_stride;
  params.num_tokens = batch.num_tokens;
  params.num_seqs = batch.num_seqs;
  params.max_blocks_per_seq = batch.max_blocks_per_seq;
  params.num_blocks = args.cache.num_blocks;

  const unsigned blocks = unsigned(ceil_div(batch.num_tokens, spec.tiling.tokens_per_block));
  loaded_->context.make_current();
  driver::launch(loaded_->kv_store,
                 driver::LaunchShape{{blocks, 1, 1}, {unsigned(spec.tiling.threads), 1, 1}, 0}, stream,
                 params);
}

}  // namespace attnplan::plan

namespace attnplan {

plan::PrefillPlan Runtime::load(const plan::CompiledPlan& compiled) {
  const driver::DeviceInfo device = driver::query_device(options_.device);
  const std::string plan_arch = compiled.arch.name();
  const bool compatible = device.major == compiled.arch.major &&
                          (compiled.arch.arch_specific ? device.minor == compiled.arch.minor
                                                       : device.minor >= compiled.arch.minor);
  if (!compatible) {
    throw Error(Stage::input,
                fmt::format("the plan was compiled for {} but device {} ({}) is {}; compile it with "
                            "--arch {} or target.arch \"auto\"",
                            plan_arch, options_.device, device.name, device.arch_name(), device.arch_name()));
  }
  auto loaded = std::make_unique<plan::PrefillPlan::Loaded>(
      plan::PrefillPlan::Loaded{driver::Context(options_.device), {}, {}, {}});
  loaded->context.make_current();
  for (const plan::PlanKernel& kernel : compiled.kernels) {
    driver::Module& module = loaded->modules.emplace_back(driver::Module::load(kernel.entry->cubin));
    driver::Function function = module.function(kernel.lowered_name);
    switch (kernel.stage) {
      case plan::StageKind::input_norm:
        loaded->input_norm = function;
        break;
      case plan::StageKind::kv_store:
        loaded->kv_store = function;
        break;
    }
  }
  return plan::PrefillPlan(compiled, std::move(loaded));
}

}  // namespace attnplan
