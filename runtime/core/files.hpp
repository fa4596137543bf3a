// Small, crash-safe file primitives. No CUDA here.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnplan::core {

// Reads a whole file. Throws Error(input) naming the path and the OS error.
std::vector<std::uint8_t> read_binary_file(const std::filesystem::path& path);
std::string read_text_file(const std::filesystem::path& path);

// Crash-safe publish: writes to a unique temp file in the same directory, fsyncs it, renames it over
// `path` and fsyncs the directory. Readers see the old file or the whole new one, never a torn write.
// Throws Error(cache) with the OS error on failure; the temp file is removed.
void write_file_atomic(const std::filesystem::path& path, const void* data, std::size_t size);
inline void write_file_atomic(const std::filesystem::path& path, std::string_view text) {
  write_file_atomic(path, text.data(), text.size());
}

// An exclusive advisory lock (flock) on `path`, created if missing. The kernel drops it when the
// holder dies, so a killed process never leaves a stale lock behind.
class FileLock {
 public:
  // Waits up to `timeout`; returns nullopt on timeout. Throws Error(cache) if the file cannot be opened.
  static std::optional<FileLock> acquire(const std::filesystem::path& path,
                                         std::chrono::milliseconds timeout);
  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace attnplan::core
