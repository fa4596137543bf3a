// Everything the runtime takes from its environment, read once into one struct. Library code below
// the Runtime never reads environment variables.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "config/target.hpp"

namespace attnplan {

struct RuntimeOptions {
  std::filesystem::path
      cache_dir;  // ATTNPLAN_CACHE_DIR, else $XDG_CACHE_HOME/attnplan, else ~/.cache/attnplan
  std::uint64_t cache_max_bytes = 2ull << 30;         // ATTNPLAN_CACHE_MAX_BYTES; 0 = no cap
  std::optional<std::filesystem::path> template_dir;  // ATTNPLAN_TEMPLATE_DIR: templates from a source tree
  std::optional<std::filesystem::path> cuda_root;     // explicit toolkit root (no variable: CLI/API only)
  std::optional<std::string> cuda_home;               // CUDA_HOME
  std::optional<std::string> cuda_path;               // CUDA_PATH
  std::optional<config::Arch> arch;                   // overrides the config's target.arch
  int device = 0;                                     // ATTNPLAN_DEVICE: CUDA device ordinal
  unsigned compile_workers = 0;                       // parallel NVRTC compiles; 0 = one per core
  bool keep_ptx = false;                              // store PTX beside each cubin

  // Reads the variables above. Throws Error(input) for malformed values (e.g. a non-numeric size).
  static RuntimeOptions from_environment();
};

}  // namespace attnplan
