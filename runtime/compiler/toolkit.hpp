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

// The version of the NVRTC library this process loaded (nvrtcVersion). Throws Error(compile) if NVRTC fails.
NvrtcVersion nvrtc_version();

// One place Toolkit::locate looks, and why it looks there.
struct ToolkitCandidate {
  std::string origin;          // "explicit root", "CUDA_HOME", "CUDA_PATH", "libnvrtc", "default"
  std::filesystem::path root;  // the would-be toolkit root, holding include/cuda_bf16.h
};

struct Toolkit {
  std::filesystem::path root;                       // e.g. /usr/local/cuda-13.0
  std::vector<std::filesystem::path> include_dirs;  // include/ and, on CUDA 13, include/cccl
  NvrtcVersion nvrtc;
  // CUDA_VERSION of the headers found ("13.0", from include/cuda.h), or "unknown". It may differ from
  // `nvrtc` when CUDA_HOME names another toolkit than the one linked, so the cache key records both.
  std::string header_version;

  // Search order: `explicit_root` (RuntimeOptions), $CUDA_HOME, $CUDA_PATH, the directory of the loaded
  // libnvrtc (its parent's include/), /usr/local/cuda. The caller passes the environment values so that
  // the environment is read once, in RuntimeOptions. An explicit root is authoritative: if it does not
  // qualify, locate throws rather than silently compiling against some other toolkit. Throws
  // Error(compile) naming every place tried and the header that was missing (cuda_bf16.h).
  static Toolkit locate(const std::optional<std::filesystem::path>& explicit_root,
                        const std::optional<std::string>& cuda_home,
                        const std::optional<std::string>& cuda_path);

  // The first candidate whose include/cuda_bf16.h exists; the building block of locate(), and testable
  // with made-up candidates. Throws Error(compile) whose details list every candidate and what it lacked.
  static Toolkit locate_in(const std::vector<ToolkitCandidate>& candidates);
};

// The candidates locate() would try, in order, without looking at the file system (duplicates removed):
// only the explicit root when there is one, else the environment values, libnvrtc's roots and the default.
std::vector<ToolkitCandidate> toolkit_candidates(const std::optional<std::filesystem::path>& explicit_root,
                                                 const std::optional<std::string>& cuda_home,
                                                 const std::optional<std::string>& cuda_path);

// The toolkit roots implied by the directory that holds libnvrtc: <lib>/.. for lib/ and lib64/ layouts, and
// also <root> for the targets/<triple>/lib layout. Pure path arithmetic, exposed for tests.
std::vector<std::filesystem::path> roots_for_library_dir(const std::filesystem::path& library_dir);

// The file this process loaded NVRTC from (dladdr on an NVRTC symbol), or nullopt if unknown.
std::optional<std::filesystem::path> loaded_nvrtc_library();

}  // namespace attnplan::compiler
