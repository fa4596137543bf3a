// The entry point of the library: a Runtime owns the options (read once), the cubin cache and the
// NVRTC compiler, and turns AttentionConfigs into plans.
//
//   attnplan::Runtime runtime(attnplan::RuntimeOptions::from_environment());
//   auto config = attnplan::config::load_file("plans/llama-3.1-8b.json");
//   attnplan::plan::CompiledPlan compiled = runtime.compile(config);     // no GPU needed
//   attnplan::plan::PrefillPlan plan = runtime.load(compiled);           // needs a GPU
//
// Thread safety: compile() may be called from several threads at once (the cache and the compiler are
// thread-safe); a PrefillPlan is immutable after load and may launch on several streams at once.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cache/cubin_cache.hpp"
#include "compiler/cache_key.hpp"
#include "compiler/compiler.hpp"
#include "config/attention_config.hpp"
#include "plan/compiled_plan.hpp"
#include "plan/prefill_plan.hpp"
#include "plan/runtime_options.hpp"

namespace attnplan {

// Reported while a plan compiles: once when a kernel starts compiling, once when it finishes.
struct CompileProgress {
  std::string kernel;
  std::size_t finished = 0;  // kernels done so far (hits included)
  std::size_t total = 0;
  bool started = false;   // true: `kernel` just started compiling; false: it just finished
  double elapsed_ms = 0;  // since compile() began
};
using ProgressCallback = std::function<void(const CompileProgress&)>;

// One kernel of a plan with its cache key, computed without compiling (what compile() looks up, and
// what `attnplan cache explain` compares with the cache's manifests).
struct PlannedKey {
  plan::StageKind stage;
  std::string name;  // the plan's kernel name ("input_rmsnorm")
  std::string family;
  compiler::KeyInputs inputs;
  std::string key;  // compiler::cache_key(inputs)
};

class Runtime {
 public:
  // `warn` receives the warnings worth a user's attention (cache degraded, bad entry quarantined...).
  // The default writes them to stderr, prefixed "attnplan: warning: ".
  explicit Runtime(RuntimeOptions options, cache::WarningSink warn = {});
  ~Runtime();

  // The arch a config compiles for: RuntimeOptions::arch, else the config's target.arch, else the device's
  // (when a driver and device are present), else sm_90a. Error(input), naming where the arch came from, for
  // one the kernels cannot target (config::arch_problem: before sm_80, say an sm_75 device).
  config::Arch resolve_arch(const config::AttentionConfig& config) const;

  // Compiles (or finds in the cache) every kernel of the config's plan. Needs no GPU and no driver.
  // RuntimeOptions::jit decides whether a kernel found nowhere may be compiled (off: Error(compile)) and
  // whether the cache directory is written (read_only) or its entries ignored (rebuild).
  plan::CompiledPlan compile(const config::AttentionConfig& config, const ProgressCallback& progress = {});

  // The keys of the config's plan for resolve_arch(config), in launch order. Needs the toolkit headers
  // (for the key), but no NVRTC run, no GPU and no cache access.
  std::vector<PlannedKey> plan_keys(const config::AttentionConfig& config);
  std::vector<PlannedKey> plan_keys(const plan::KernelPlan& kernels, const config::Arch& arch);

  // Loads a compiled plan on the device of RuntimeOptions::device. Needs a driver and a device whose
  // arch matches the plan's.
  plan::PrefillPlan load(const plan::CompiledPlan& compiled);

  cache::CubinCache& cache() { return cache_; }
  // The compiler, created on first use (it locates the CUDA toolkit headers).
  const compiler::Compiler& compiler();
  compiler::CompileOptions compile_options(const config::Arch& arch) const;
  const RuntimeOptions& options() const { return options_; }
  // What RuntimeOptions asks of every plan beyond its config (the trace).
  plan::PlanOptions plan_options() const { return {.trace_attention = options_.trace_attention}; }

 private:
  // What target.arch "auto" means here: the device's arch (remembered per machine), else sm_90a.
  config::Arch auto_arch() const;
  // Error(compile) for JitPolicy::off: `kernel` is in no tier and may not be compiled.
  Error not_prebuilt_error(const PlannedKey& kernel) const;

  RuntimeOptions options_;
  cache::WarningSink warn_;
  cache::CubinCache cache_;
  std::mutex compiler_mutex_;
  std::unique_ptr<compiler::Compiler> compiler_;
};

}  // namespace attnplan
