// Shared pieces of the libFuzzer harnesses: a per-process scratch location for readers that only take
// a path (the safetensors reader maps a file; the cache reads a directory). Every harness follows one
// rule: an attnplan::Error is a correct refusal; anything else escaping the reader is a bug, and so is
// left uncaught for libFuzzer to report.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace attnplan::fuzz {

// A per-process scratch file or directory, removed when the process exits normally (libFuzzer ends a
// timed run with exit(), which runs static destructors; after a crash it stays, beside the reproducer).
// /dev/shm keeps the per-input writes (thousands per second) off the disk; the pid keeps parallel jobs
// (-jobs=N) apart.
class ScratchPath {
 public:
  explicit ScratchPath(const std::string& name) {
    std::error_code error;
    const std::filesystem::path shm = "/dev/shm";
    const std::filesystem::path base =
        std::filesystem::is_directory(shm, error) ? shm : std::filesystem::temp_directory_path();
    path_ = base / ("attnplan-fuzz-" + std::to_string(::getpid()) + "-" + name);
  }
  ScratchPath(const ScratchPath&) = delete;
  ScratchPath& operator=(const ScratchPath&) = delete;
  ~ScratchPath() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::filesystem::path& get() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes `size` bytes; aborts on failure, since a harness that cannot write its input tests nothing.
inline void write_bytes(const std::filesystem::path& path, const std::uint8_t* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) __builtin_trap();
}

}  // namespace attnplan::fuzz
