// Shared pieces of the cache tests: keys, a deterministic fake build, and a warning recorder.
#pragma once

#include <array>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "cache/cubin_cache.hpp"
#include "core/sha256.hpp"

namespace attnplan::testing {

// A valid key (64 lowercase hex digits) named by a readable word.
inline std::string key_for(const std::string& name) {
  return core::sha256_hex("test key " + name);
}

// Stand-in cubin: an ELF magic then bytes derived from the key, so each key has its own content and
// a rebuild reproduces it exactly.
inline std::vector<std::uint8_t> fake_cubin(const std::string& key, std::size_t size = 4096) {
  std::vector<std::uint8_t> bytes = {0x7f, 'E', 'L', 'F'};
  core::Sha256 seed;
  const std::array<std::uint8_t, 32> digest = seed.update(key).digest();
  while (bytes.size() < size)
    bytes.push_back(digest[bytes.size() % 32] ^ static_cast<std::uint8_t>(bytes.size()));
  return bytes;
}

// A build callback's result with the kinds of fields the compiler supplies; the cache must store them as is.
inline cache::CubinCache::Built fake_built(const std::string& key, std::size_t size = 4096,
                                           std::string ptx = {}) {
  cache::CubinCache::Built built;
  built.cubin = fake_cubin(key, size);
  built.ptx = std::move(ptx);
  built.manifest = {{"name", "rmsnorm"},
                    {"spec", {{"head_dim", 128}, {"dtype", "bf16"}}},
                    {"lowered_name", "_Z7rmsnormILi128EEvv"},
                    {"options", {"-arch=sm_90a", "-lineinfo"}},
                    {"arch", "sm_90a"},
                    {"nvrtc_version", "13.0"},
                    {"resources", {{"registers", 64}, {"shared_bytes", 0}}},
                    {"compile_ms", 12.5}};
  return built;
}

// Records warnings; safe to call from several threads.
class WarningLog {
 public:
  cache::WarningSink sink() {
    return [this](const std::string& message) {
      std::lock_guard lock(mutex_);
      messages_.push_back(message);
    };
  }
  std::vector<std::string> messages() const {
    std::lock_guard lock(mutex_);
    return messages_;
  }
  std::size_t count() const { return messages().size(); }
  std::string all() const {
    std::string joined;
    for (const std::string& message : messages()) joined += message + "\n";
    return joined;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> messages_;
};

inline cache::CacheOptions options_for(const std::filesystem::path& directory, std::uint64_t max_bytes = 0) {
  cache::CacheOptions options;
  options.directory = directory;
  options.max_bytes = max_bytes;
  options.lock_timeout = std::chrono::seconds(20);
  return options;
}

// Every entry under `root` for which `keep(directory_entry)` holds; empty when `root` does not exist.
template <class Keep>
std::vector<std::filesystem::path> files_under(const std::filesystem::path& root, Keep keep) {
  std::vector<std::filesystem::path> found;
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(root, error);
       !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
    if (keep(*it)) found.push_back(it->path());
  }
  return found;
}

// Temp files of publishes (names starting with '.'); should be none at rest.
inline std::vector<std::filesystem::path> temp_files_under(const std::filesystem::path& root) {
  return files_under(root, [](const auto& item) { return item.path().filename().string().starts_with("."); });
}

// Every regular file: none should be left by a cache that could not publish.
inline std::vector<std::filesystem::path> regular_files_under(const std::filesystem::path& root) {
  return files_under(root, [](const auto& item) { return item.is_regular_file(); });
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace attnplan::testing
