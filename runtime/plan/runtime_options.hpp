// Everything the runtime takes from its environment, read once into one struct. Library code below
// the Runtime never reads environment variables.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/target.hpp"

namespace attnplan {

// Whether a Runtime may run NVRTC and write the cache (docs/cache.md, "JIT policy").
enum class JitPolicy {
  on,         // look up memory, read-only tiers, the cache directory; compile and publish misses
  off,        // never compile: a kernel missing from every tier is Error(compile) naming it and its key
  read_only,  // compile misses but keep them in memory: nothing is written to the cache directory
  rebuild,    // ignore existing entries, recompile every kernel once and publish it over the old one
};

// "on", "off", "read-only", "rebuild" (the ATTNPLAN_JIT / --jit spellings); nullopt for anything else.
std::optional<JitPolicy> parse_jit_policy(std::string_view text);
std::string_view to_string(JitPolicy policy);

// A colon-separated directory list (ATTNPLAN_CACHE_PATH) in order; empty components are skipped, as
// in PATH-like variables that were assembled with a stray ':'.
std::vector<std::filesystem::path> parse_cache_path(std::string_view text);

struct RuntimeOptions {
  std::filesystem::path
      cache_dir;  // ATTNPLAN_CACHE_DIR, else $XDG_CACHE_HOME/attnplan, else ~/.cache/attnplan
  std::uint64_t cache_max_bytes = 2ull << 30;  // ATTNPLAN_CACHE_MAX_BYTES; 0 = no cap
  // ATTNPLAN_CACHE_PATH: read-only cache roots (prebuilt packs) searched, in order, before cache_dir.
  std::vector<std::filesystem::path> cache_path;
  JitPolicy jit = JitPolicy::on;                      // ATTNPLAN_JIT
  std::optional<std::filesystem::path> template_dir;  // ATTNPLAN_TEMPLATE_DIR: templates from a source tree
  std::optional<std::filesystem::path> cuda_root;     // explicit toolkit root (no variable: CLI/API only)
  std::optional<std::string> cuda_home;               // CUDA_HOME
  std::optional<std::string> cuda_path;               // CUDA_PATH
  std::optional<config::Arch> arch;                   // overrides the config's target.arch
  std::optional<std::string> cuda_visible_devices;    // CUDA_VISIBLE_DEVICES: part of the device identity
  int device = 0;                                     // ATTNPLAN_DEVICE: CUDA device ordinal
  unsigned compile_workers = 0;                       // parallel NVRTC compiles; 0 = one per core
  bool keep_ptx = false;                              // store PTX beside each cubin
  // Plans with the attention trace compiled in (plan::PlanOptions::trace_attention; no variable: CLI/API
  // only, for `attnplan bench --trace-attention`).
  bool trace_attention = false;

  // Reads the variables above. Throws Error(input) for malformed values (a non-numeric size, an
  // unknown ATTNPLAN_JIT).
  static RuntimeOptions from_environment();
};

}  // namespace attnplan
