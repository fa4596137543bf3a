// A plan whose kernels are compiled (or found in the cache) for one arch: cubins and their reports,
// no GPU involved. PrefillPlan loads it onto a device.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cache/cubin_cache.hpp"
#include "compiler/compiler.hpp"
#include "config/attention_config.hpp"
#include "plan/kernel_plan.hpp"

namespace attnplan::plan {

struct PlanKernel {
  StageKind stage;
  std::string name;
  compiler::KernelSource source;
  std::string key;             // cache key, 64 hex digits
  cache::Lookup lookup;        // hit (cache dir), prebuilt (read-only tier), miss (compiled now), memory
  std::filesystem::path tier;  // the cache root that served a hit or prebuilt entry; empty otherwise
  double compile_ms = 0;       // NVRTC time spent by this build; 0 on a hit
  std::string lowered_name;    // the kernel symbol inside the cubin
  compiler::ResourceUsage resources;
  std::shared_ptr<const cache::Entry> entry;  // the cubin and its manifest
};

struct CompiledPlan {
  config::AttentionConfig config;
  config::Arch arch;
  KernelPlan kernels_planned;
  std::vector<PlanKernel> kernels;  // launch order
  double wall_ms = 0;               // the whole compile() call

  const PlanKernel& kernel(StageKind stage) const;
};

}  // namespace attnplan::plan
