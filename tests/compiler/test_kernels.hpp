// Kernel sources for the compiler tests, built by hand the way the plan's typed specs will build them.
#pragma once

#include <optional>
#include <string>

#include "compiler/compiler.hpp"

namespace attnplan::testing {

inline std::string bool_text(bool value) {
  return value ? "true" : "false";
}

inline compiler::KernelSource rmsnorm_source(int hidden_size, int threads, bool unit_offset) {
  compiler::KernelSource source;
  source.family = "rmsnorm";
  source.header = "attnplan/rmsnorm.cuh";
  source.traits = "attnplan::kernels::RmsNormTraits";
  source.kernel = "attnplan::kernels::rmsnorm_kernel";
  source.arguments = {{"hidden_size", std::to_string(hidden_size)},
                      {"threads", std::to_string(threads)},
                      {"unit_offset", bool_text(unit_offset)}};
  source.spec = {
      {"kind", "rmsnorm"}, {"hidden_size", hidden_size}, {"threads", threads}, {"unit_offset", unit_offset}};
  return source;
}

inline compiler::KernelSource kv_store_source(int kv_heads, int head_dim, int value_head_dim, int block_size,
                                              int threads, int tokens_per_block) {
  compiler::KernelSource source;
  source.family = "kv_store";
  source.header = "attnplan/kv_store.cuh";
  source.traits = "attnplan::kernels::KvStoreTraits";
  source.kernel = "attnplan::kernels::kv_store_kernel";
  source.arguments = {{"kv_heads", std::to_string(kv_heads)},
                      {"head_dim", std::to_string(head_dim)},
                      {"value_head_dim", std::to_string(value_head_dim)},
                      {"block_size", std::to_string(block_size)},
                      {"threads", std::to_string(threads)},
                      {"tokens_per_block", std::to_string(tokens_per_block)}};
  source.spec = {{"kind", "kv_store"},
                 {"kv_heads", kv_heads},
                 {"head_dim", head_dim},
                 {"value_head_dim", value_head_dim},
                 {"block_size", block_size},
                 {"threads", threads},
                 {"tokens_per_block", tokens_per_block}};
  return source;
}

// The toolkit this test binary's NVRTC came with, found without reading the environment.
inline const compiler::Toolkit& test_toolkit() {
  static const compiler::Toolkit toolkit =
      compiler::Toolkit::locate(std::nullopt, std::nullopt, std::nullopt);
  return toolkit;
}

inline const compiler::Compiler& test_compiler() {
  static const compiler::Compiler instance(test_toolkit(), compiler::TemplateLibrary::embedded());
  return instance;
}

inline constexpr config::Arch kSm80{8, 0, false};
inline constexpr config::Arch kSm90a{9, 0, true};

}  // namespace attnplan::testing
