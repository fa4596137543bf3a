// Where the CUDA toolkit headers the templates need live, found at run time.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace attnplan::compiler {

struct NvrtcVersion {
  int major = 0;
  int minor = 0;
  std::string str() const;  // "13.0"
};

NvrtcVersion nvrtc_version();

struct Toolkit {
  std::filesystem::path root;                        // e.g. /usr/local/cuda-13.0
  std::vector<std::filesystem::path> include_dirs;   // include/ and, on CUDA 13, include/cccl
  NvrtcVersion nvrtc;

  // Search order: `explicit_root` (RuntimeOptions), $CUDA_HOME, $CUDA_PATH, the directory of the loaded
  // libnvrtc (its parent's include/), /usr/local/cuda. The caller passes the environment values so that
  // the environment is read once, in RuntimeOptions. Throws Error(compile) naming every place tried and
  // the header that was missing (cuda_bf16.h).
  static Toolkit locate(const std::optional<std::filesystem::path>& explicit_root,
                        const std::optional<std::string>& cuda_home, const std::optional<std::string>& cuda_path);
};

}  // namespace attnplan::compiler
