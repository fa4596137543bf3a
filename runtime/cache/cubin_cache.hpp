// Content-addressed cubin store: an in-memory map over an on-disk directory of
// <key>.cubin + <key>.json (manifest) entries. See docs/cache.md for the layout and the guarantees.
//
// Guarantees: a published entry is complete (temp file + fsync + rename, cubin before manifest);
// readers take no lock; writers of one key serialize on a per-key flock with a timeout and re-check
// after taking it; a cubin whose SHA-256 differs from its manifest is moved to quarantine/, reported
// and rebuilt; an unwritable directory degrades to in-memory compilation with one warning.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace attnplan::cache {

// Bumped whenever the on-disk layout or the manifest schema changes; part of every key and of the path.
inline constexpr int kFormatVersion = 1;

struct CacheOptions {
  std::filesystem::path directory;         // root; entries live under <root>/v<kFormatVersion>/
  std::uint64_t max_bytes = 2ull << 30;    // size cap; LRU pruning after each publish beyond it (0: no cap)
  std::chrono::milliseconds lock_timeout{60000};
};

// The default root: $ATTNPLAN_CACHE_DIR, else $XDG_CACHE_HOME/attnplan, else $HOME/.cache/attnplan.
// The caller passes the environment values (read once, in RuntimeOptions).
std::filesystem::path default_directory(const std::optional<std::string>& attnplan_cache_dir,
                                        const std::optional<std::string>& xdg_cache_home,
                                        const std::optional<std::string>& home);

struct Entry {
  std::string key;                   // 64 hex digits
  std::vector<std::uint8_t> cubin;
  nlohmann::json manifest;           // see docs/cache.md for the fields
};

enum class Lookup { hit, miss, memory };  // memory: served from this process's map, no disk access

struct Fetched {
  std::shared_ptr<const Entry> entry;
  Lookup lookup;
};

// Called for each problem worth telling a user about (bad entry quarantined, directory unwritable...).
using WarningSink = std::function<void(const std::string&)>;

struct EntryInfo {
  std::string key;
  std::uint64_t bytes = 0;  // cubin + manifest (+ ptx)
  nlohmann::json manifest;  // empty when the manifest is unreadable
  std::filesystem::file_time_type last_used;
};

struct VerifyReport {
  int checked = 0;
  std::vector<std::string> problems;  // one line each: "<key>: <what is wrong>"
};

class CubinCache {
 public:
  CubinCache(CacheOptions options, WarningSink warn);

  // Returns the entry for `key`, building it with `build` on a miss. `build` returns the cubin and the
  // manifest fields it knows (spec, names, resources...); the cache adds key, sha256, sizes, created.
  // `ptx` (may be empty) is stored beside the cubin.
  struct Built {
    std::vector<std::uint8_t> cubin;
    std::string ptx;
    nlohmann::json manifest;
  };
  Fetched get_or_build(const std::string& key, const std::function<Built()>& build);

  // Disk lookup without building (used by `attnplan cache explain`/tests). Quarantines bad entries.
  std::shared_ptr<const Entry> find(const std::string& key);

  std::vector<EntryInfo> list() const;
  VerifyReport verify() const;               // checks every entry's hash and manifest; changes nothing
  std::uint64_t prune(std::uint64_t max_bytes);  // LRU; returns bytes removed
  void clear();
  std::optional<std::string> ptx(const std::string& key) const;

  const std::filesystem::path& directory() const { return options_.directory; }
  std::filesystem::path entries_directory() const;  // <root>/v1
  bool writable() const { return writable_; }

 private:
  CacheOptions options_;
  WarningSink warn_;
  bool writable_ = true;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const Entry>> memory_;
};

}  // namespace attnplan::cache
