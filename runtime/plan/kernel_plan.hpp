// From an AttentionConfig to the list of kernels its prefill plan runs: a pure function, no GPU,
// no compiler. Each planned kernel carries its typed spec rendered to a KernelSource.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "compiler/kernel_source.hpp"
#include "config/attention_config.hpp"
#include "plan/kernel_specs.hpp"

namespace attnplan::plan {

// The plan's stages in launch order (design.md). The foundation builds the input norm and the KV store;
// the remaining stages of the layer join this list as their templates land.
enum class StageKind { input_norm, kv_store };

std::string_view to_string(StageKind stage);

struct PlannedKernel {
  StageKind stage;
  std::string name;  // stable, human-readable: "input_rmsnorm", "kv_store"
  compiler::KernelSource source;
};

struct KernelPlan {
  RmsNormSpec input_norm;
  KvStoreSpec kv_store;
  std::vector<PlannedKernel> kernels;  // in launch order
};

KernelPlan plan_kernels(const config::AttentionConfig& config);

}  // namespace attnplan::plan
