#include "compiler/toolkit.hpp"

#include <dlfcn.h>
#include <nvrtc.h>

#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attnplan::compiler {

namespace fs = std::filesystem;

namespace {

// The one header every template needs (common.cuh includes it); a root without it is not a toolkit.
constexpr const char* kRequiredHeader = "cuda_bf16.h";

bool is_existing_file(const fs::path& path) {
  std::error_code ignored;
  return fs::is_regular_file(path, ignored);
}

bool is_existing_directory(const fs::path& path) {
  std::error_code ignored;
  return fs::is_directory(path, ignored);
}

// "13.0" from `#define CUDA_VERSION 13000` in include/cuda.h (major * 1000 + minor * 10).
std::string read_header_version(const fs::path& include_dir) {
  std::ifstream file(include_dir / "cuda.h");
  std::string line;
  while (file && std::getline(file, line)) {
    std::istringstream words(line);
    std::string hash, name;
    words >> hash >> name;
    // cuda.h spells it `#define CUDA_VERSION 13000`; `# define` splits the first word.
    if (hash == "#" && name == "define") words >> name;
    if ((hash != "#define" && hash != "#") || name != "CUDA_VERSION") continue;
    int version = 0;
    if (!(words >> version) || version <= 0) break;
    return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
  }
  return "unknown";
}

}  // namespace

std::string NvrtcVersion::str() const {
  return fmt::format("{}.{}", major, minor);
}

NvrtcVersion nvrtc_version() {
  NvrtcVersion version;
  const nvrtcResult result = nvrtcVersion(&version.major, &version.minor);
  if (result != NVRTC_SUCCESS) {
    throw Error(Stage::compile, fmt::format("nvrtcVersion failed: {}", nvrtcGetErrorString(result)));
  }
  return version;
}

std::optional<fs::path> loaded_nvrtc_library() {
  Dl_info info{};
  // Any NVRTC entry point resolves to the shared object it came from; with a static NVRTC this names the
  // executable instead, whose directory then simply fails to qualify.
  if (dladdr(reinterpret_cast<const void*>(&nvrtcVersion), &info) == 0 || info.dli_fname == nullptr) {
    return std::nullopt;
  }
  fs::path library(info.dli_fname);
  if (library.empty() || !library.has_parent_path()) return std::nullopt;
  return library.lexically_normal();
}

std::vector<fs::path> roots_for_library_dir(const fs::path& library_dir) {
  fs::path dir = library_dir.lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "lib/" -> "lib"
  std::vector<fs::path> roots;
  // <root>/lib, <root>/lib64, and <root>/targets/<triple>/lib, whose <root>/targets/<triple>/include is
  // the real header directory in a runfile install.
  roots.push_back(dir.parent_path());
  const fs::path triple = dir.parent_path();
  if (triple.parent_path().filename() == "targets") roots.push_back(triple.parent_path().parent_path());
  return roots;
}

std::vector<ToolkitCandidate> toolkit_candidates(const std::optional<fs::path>& explicit_root,
                                                 const std::optional<std::string>& cuda_home,
                                                 const std::optional<std::string>& cuda_path) {
  if (explicit_root) return {{"explicit root", *explicit_root}};

  std::vector<ToolkitCandidate> candidates;
  std::set<std::string> seen;
  auto add = [&](std::string origin, const fs::path& root) {
    if (root.empty()) return;
    fs::path normal = root.lexically_normal();
    if (!normal.has_filename() && normal.has_parent_path() && normal != normal.root_path()) {
      normal = normal.parent_path();  // "/usr/local/cuda/" and "/usr/local/cuda" are one candidate
    }
    if (seen.insert(normal.string()).second) candidates.push_back({std::move(origin), normal});
  };
  // Empty variables count as unset: `CUDA_HOME= attnplan ...` is a common way to clear one.
  if (cuda_home && !cuda_home->empty()) add("CUDA_HOME", *cuda_home);
  if (cuda_path && !cuda_path->empty()) add("CUDA_PATH", *cuda_path);
  if (const auto library = loaded_nvrtc_library()) {
    for (const fs::path& root : roots_for_library_dir(library->parent_path())) {
      add(fmt::format("libnvrtc ({})", library->string()), root);
    }
  }
  add("default", "/usr/local/cuda");
  return candidates;
}

Toolkit Toolkit::locate_in(const std::vector<ToolkitCandidate>& candidates) {
  std::vector<std::string> tried;
  for (const ToolkitCandidate& candidate : candidates) {
    const fs::path include_dir = candidate.root / "include";
    if (!is_existing_file(include_dir / kRequiredHeader)) {
      const char* why = !is_existing_directory(candidate.root) ? "directory not found"
                        : !is_existing_directory(include_dir)  ? "no include/ directory"
                                                               : "include/cuda_bf16.h not found";
      tried.push_back(fmt::format("{}: {}: {}", candidate.origin, candidate.root.string(), why));
      continue;
    }
    Toolkit toolkit;
    toolkit.root = candidate.root;
    toolkit.include_dirs.push_back(include_dir);
    // CUDA 13 moved CCCL (cuda/std, cub, thrust) under include/cccl; cuda_fp16/bf16 may reach into it.
    if (is_existing_directory(include_dir / "cccl")) toolkit.include_dirs.push_back(include_dir / "cccl");
    toolkit.nvrtc = nvrtc_version();
    toolkit.header_version = read_header_version(include_dir);
    return toolkit;
  }
  std::string payload;
  for (const std::string& line : tried) payload += line + "\n";
  if (tried.empty()) payload = "no candidate directories\n";
  throw Error(Stage::compile,
              fmt::format("CUDA toolkit headers not found: no candidate has include/{} (set CUDA_HOME or "
                          "the explicit toolkit root)",
                          kRequiredHeader),
              payload, tried);
}

Toolkit Toolkit::locate(const std::optional<fs::path>& explicit_root,
                        const std::optional<std::string>& cuda_home,
                        const std::optional<std::string>& cuda_path) {
  return locate_in(toolkit_candidates(explicit_root, cuda_home, cuda_path));
}

}  // namespace attnplan::compiler
