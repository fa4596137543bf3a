#include "plan/runtime.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "compiler/cache_key.hpp"
#include "compiler/parallel.hpp"
#include "core/error.hpp"
#include "driver/device.hpp"
#include "plan/arch_memo.hpp"

namespace attnplan {

namespace {

cache::WarningSink stderr_sink() {
  return [](const std::string& message) { std::fprintf(stderr, "attnplan: warning: %s\n", message.c_str()); };
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

compiler::ResourceUsage resources_from_manifest(const nlohmann::json& manifest) {
  compiler::ResourceUsage usage;
  const nlohmann::json resources = manifest.value("resources", nlohmann::json::object());
  usage.registers = resources.value("registers", 0);
  usage.shared_bytes = resources.value("shared_bytes", 0);
  usage.spill_store_bytes = resources.value("spill_store_bytes", 0);
  usage.spill_load_bytes = resources.value("spill_load_bytes", 0);
  usage.stack_bytes = resources.value("stack_bytes", 0);
  usage.constant_bytes = resources.value("constant_bytes", 0);
  usage.barriers = resources.value("barriers", 0);
  return usage;
}

nlohmann::json resources_to_json(const compiler::ResourceUsage& usage) {
  return {{"registers", usage.registers},
          {"shared_bytes", usage.shared_bytes},
          {"spill_store_bytes", usage.spill_store_bytes},
          {"spill_load_bytes", usage.spill_load_bytes},
          {"stack_bytes", usage.stack_bytes},
          {"constant_bytes", usage.constant_bytes},
          {"barriers", usage.barriers}};
}

cache::CacheOptions cache_options(const RuntimeOptions& options) {
  cache::CacheOptions cache;
  cache.directory = options.cache_dir;
  cache.max_bytes = options.cache_max_bytes;
  cache.read_only_tiers = options.cache_path;
  cache.never_write = options.jit == JitPolicy::read_only;
  cache.rebuild = options.jit == JitPolicy::rebuild;
  return cache;
}

}  // namespace

Runtime::Runtime(RuntimeOptions options, cache::WarningSink warn)
    : options_(std::move(options)),
      warn_(warn ? std::move(warn) : stderr_sink()),
      cache_(cache_options(options_), warn_) {}

Runtime::~Runtime() = default;

const compiler::Compiler& Runtime::compiler() {
  std::lock_guard lock(compiler_mutex_);
  if (!compiler_) {
    compiler::Toolkit toolkit =
        compiler::Toolkit::locate(options_.cuda_root, options_.cuda_home, options_.cuda_path);
    compiler::TemplateLibrary templates =
        options_.template_dir ? compiler::TemplateLibrary::from_directory(*options_.template_dir)
                              : compiler::TemplateLibrary::embedded();
    compiler_ = std::make_unique<compiler::Compiler>(std::move(toolkit), std::move(templates));
  }
  return *compiler_;
}

compiler::CompileOptions Runtime::compile_options(const config::Arch& arch) const {
  compiler::CompileOptions options;
  options.arch = arch;
  options.keep_ptx = options_.keep_ptx;
  return options;
}

config::Arch Runtime::resolve_arch(const config::AttentionConfig& config) const {
  const auto checked = [](const config::Arch& arch, std::string_view source) {
    if (const std::optional<std::string> problem = config::arch_problem(arch))
      throw Error(Stage::input, fmt::format("{}: {}", source, *problem));
    return arch;
  };
  if (options_.arch) return checked(*options_.arch, "RuntimeOptions::arch");
  if (config.target.arch) return checked(*config.target.arch, "/target/arch");
  return checked(auto_arch(), "/target/arch: \"auto\" (the device's arch)");
}

config::Arch Runtime::auto_arch() const {
  // The device's arch, remembered per machine so that a warm compile does not pay cuInit.
  const std::optional<std::string> identity =
      plan::device_identity("/proc", options_.device, options_.cuda_visible_devices);
  if (identity) {
    if (auto remembered = plan::remembered_arch(options_.cache_dir, *identity)) return *remembered;
  }
  std::string reason;
  if (driver::device_available(&reason)) {
    const driver::DeviceInfo device = driver::query_device(options_.device);
    if (auto arch = config::parse_arch(device.arch_name())) {
      // read-only writes nothing to the cache directory, the memo included.
      if (identity && options_.jit != JitPolicy::read_only)
        plan::remember_arch(options_.cache_dir, *identity, *arch);
      return *arch;
    }
  }
  return config::kDefaultArch;
}

std::vector<PlannedKey> Runtime::plan_keys(const config::AttentionConfig& config) {
  const config::Arch arch = resolve_arch(config);
  return plan_keys(plan::plan_kernels(config, arch, plan_options()), arch);
}

std::vector<PlannedKey> Runtime::plan_keys(const plan::KernelPlan& kernels, const config::Arch& arch) {
  const compiler::Compiler& nvrtc = compiler();
  const compiler::CompileOptions options = compile_options(arch);
  std::vector<PlannedKey> keys;
  keys.reserve(kernels.kernels.size());
  for (const plan::PlannedKernel& planned : kernels.kernels) {
    PlannedKey& planned_key = keys.emplace_back();
    planned_key.stage = planned.stage;
    planned_key.name = planned.name;
    planned_key.family = planned.source.family;
    planned_key.inputs = compiler::key_inputs(planned.source, options, nvrtc.toolkit(), nvrtc.templates(),
                                              cache::kFormatVersion);
    planned_key.key = compiler::cache_key(planned_key.inputs);
  }
  return keys;
}

Error Runtime::not_prebuilt_error(const PlannedKey& kernel) const {
  std::vector<std::string> searched;
  for (const std::filesystem::path& tier : options_.cache_path)
    searched.push_back(tier.string() + " (read-only)");
  if (!options_.cache_dir.empty()) searched.push_back(options_.cache_dir.string());
  return Error(
      Stage::compile,
      fmt::format("kernel {} (key {}) is not prebuilt or cached, and the JIT policy is off "
                  "(ATTNPLAN_JIT / --jit), so it is not compiled",
                  kernel.name, kernel.key),
      {},
      {searched.empty() ? std::string("searched: no cache directory")
                        : fmt::format("searched: {}", fmt::join(searched, ", ")),
       fmt::format("prebuild it with 'attnplan compile CONFIG --arch {} --cache-dir DIR' and add DIR "
                   "to ATTNPLAN_CACHE_PATH",
                   kernel.inputs.arch)});
}

plan::CompiledPlan Runtime::compile(const config::AttentionConfig& config, const ProgressCallback& progress) {
  const auto start = std::chrono::steady_clock::now();
  plan::CompiledPlan compiled;
  compiled.config = config;
  compiled.arch = resolve_arch(config);
  compiled.kernels_planned = plan::plan_kernels(config, compiled.arch, plan_options());

  // Keys first, all of them: cheap next to a compile, and JitPolicy::off then fails on the first
  // missing kernel in launch order however the workers are scheduled.
  const std::vector<PlannedKey> keys = plan_keys(compiled.kernels_planned, compiled.arch);
  const compiler::Compiler& nvrtc = compiler();
  const compiler::CompileOptions options = compile_options(compiled.arch);

  const std::size_t total = compiled.kernels_planned.kernels.size();
  compiled.kernels.resize(total);
  std::mutex progress_mutex;
  std::size_t finished = 0;
  auto report = [&](const std::string& kernel, bool started) {
    if (!progress) return;
    std::lock_guard lock(progress_mutex);
    if (!started) ++finished;
    progress(CompileProgress{kernel, finished, total, started, milliseconds_since(start)});
  };

  const unsigned workers = options_.compile_workers != 0 ? options_.compile_workers
                                                         : std::max(1u, std::thread::hardware_concurrency());
  // JitPolicy::off looks every kernel up before anything else, in launch order, so that the error names
  // the first missing kernel however the workers would have been scheduled; the loop uses what it found.
  std::vector<std::optional<cache::Fetched>> prefetched(total);
  if (options_.jit == JitPolicy::off) {
    for (std::size_t index = 0; index < total; ++index) {
      prefetched[index] = cache_.get_or_build(
          keys[index].key, [&]() -> cache::CubinCache::Built { throw not_prebuilt_error(keys[index]); });
    }
  }

  compiler::for_each_parallel(total, workers, [&](std::size_t index) {
    const plan::PlannedKernel& planned = compiled.kernels_planned.kernels[index];
    plan::PlanKernel& kernel = compiled.kernels[index];
    kernel.stage = planned.stage;
    kernel.name = planned.name;
    kernel.source = planned.source;

    const compiler::KeyInputs& inputs = keys[index].inputs;
    kernel.key = keys[index].key;

    double compile_ms = 0;
    cache::Fetched fetched = prefetched[index] ? *prefetched[index] : cache_.get_or_build(kernel.key, [&]() {
      report(planned.name, /*started=*/true);
      compiler::CompiledKernel built = nvrtc.compile(planned.source, options);
      compile_ms = built.compile_ms;
      cache::CubinCache::Built entry;
      entry.cubin = std::move(built.cubin);
      entry.ptx = std::move(built.ptx);
      entry.manifest = {{"name", planned.name},
                        {"stage", std::string(plan::to_string(planned.stage))},
                        {"family", planned.source.family},
                        {"spec", planned.source.spec},
                        {"stub", planned.source.render_stub()},
                        {"lowered_name", built.lowered_name},
                        {"arch", compiled.arch.name()},
                        {"options", inputs.options},
                        {"nvrtc_version", inputs.nvrtc_version},
                        {"key_inputs", inputs.to_json()},
                        {"resources", resources_to_json(built.resources)},
                        {"compile_ms", built.compile_ms}};
      return entry;
    });
    kernel.lookup = fetched.lookup;
    kernel.tier = fetched.tier;
    kernel.entry = fetched.entry;
    kernel.compile_ms = compile_ms;
    kernel.lowered_name = fetched.entry->manifest.value("lowered_name", "");
    kernel.resources = resources_from_manifest(fetched.entry->manifest);
    if (kernel.lowered_name.empty()) {
      throw Error(Stage::cache,
                  fmt::format("cache entry {} for kernel {} has no lowered_name", kernel.key, kernel.name));
    }
    report(planned.name, /*started=*/false);
  });

  compiled.wall_ms = milliseconds_since(start);
  return compiled;
}

}  // namespace attnplan
