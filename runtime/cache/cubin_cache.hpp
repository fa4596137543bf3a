// Content-addressed cubin store: an in-memory map over an on-disk directory of
// <key>.cubin + <key>.json (manifest) entries. See docs/cache.md for the layout and the guarantees.
//
// Guarantees: a published entry is complete (temp file + fsync + rename, cubin before manifest);
// readers take no lock; writers of one key serialize on a per-key flock with a timeout and re-check
// after taking it; a cubin whose SHA-256 differs from its manifest is moved to quarantine/, reported
// and rebuilt; an unwritable directory degrades to in-memory compilation with one warning.
// Read-only tiers (prebuilt packs) are consulted before the writable directory and never modified.
//
// Thread safety: every member function may be called from several threads at once. Threads of one
// process asking for the same key wait for the first one, so a key is built once per process; across
// processes the per-key file lock plus a re-check after taking it does the same.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/files.hpp"

namespace attnplan::cache {

// Bumped whenever the on-disk layout or the manifest schema changes; part of every key and of the path.
inline constexpr int kFormatVersion = 1;

struct CacheOptions {
  // Root; entries live under <root>/v<kFormatVersion>/. Empty: no directory could be determined, so
  // the cache works in memory only (with the one "not writable" warning).
  std::filesystem::path directory;
  std::uint64_t max_bytes = 2ull << 30;  // size cap; LRU pruning after each publish beyond it (0: no cap)
  std::chrono::milliseconds lock_timeout{60000};
  // Roots laid out like `directory` (entries under <tier>/v<kFormatVersion>/), searched in order before
  // it. They are only read: no mtime refresh, no lock, no quarantine; a bad entry there is skipped with
  // one warning. A tier that does not exist is simply empty.
  std::vector<std::filesystem::path> read_only_tiers;
  // Never write to `directory`: no probe, no publish, no lock, no LRU refresh; misses stay in memory.
  bool never_write = false;
  // Ignore every entry on disk (tiers included) and build each key once in this process, then publish it
  // over whatever was there. Hits from this process's memory still count.
  bool rebuild = false;
};

// The default root: $ATTNPLAN_CACHE_DIR, else $XDG_CACHE_HOME/attnplan, else $HOME/.cache/attnplan.
// The caller passes the environment values (read once, in RuntimeOptions). Unset and empty values are
// skipped, and so is a relative XDG_CACHE_HOME (the XDG spec says to ignore it). Returns an empty path
// when none applies.
std::filesystem::path default_directory(const std::optional<std::string>& attnplan_cache_dir,
                                        const std::optional<std::string>& xdg_cache_home,
                                        const std::optional<std::string>& home);

// True for exactly 64 lowercase hex digits, the only keys the cache accepts (a key becomes a file
// name, so anything else could escape the cache directory).
bool is_valid_key(std::string_view key);

struct Entry {
  std::string key;  // 64 hex digits
  std::vector<std::uint8_t> cubin;
  nlohmann::json manifest;  // see docs/cache.md for the fields
};

// hit: the writable directory; prebuilt: a read-only tier; miss: built now; memory: this process's map.
enum class Lookup { hit, miss, memory, prebuilt };

struct Fetched {
  std::shared_ptr<const Entry> entry;
  Lookup lookup;
  std::filesystem::path tier;  // the root that served a hit or prebuilt entry; empty otherwise
};

// Called for each problem worth telling a user about (bad entry quarantined, directory unwritable...).
// Calls are serialized by the cache, so the sink need not be thread-safe.
using WarningSink = std::function<void(const std::string&)>;

struct EntryInfo {
  std::string key;
  std::uint64_t bytes = 0;                    // cubin + manifest (+ ptx)
  nlohmann::json manifest;                    // null when the manifest is missing or unreadable
  std::filesystem::file_time_type last_used;  // the manifest's mtime (the cubin's if there is no manifest)
  std::filesystem::path root;                 // the cache root it lives under (a tier or the directory)
};

struct VerifyReport {
  int checked = 0;
  std::vector<std::string> problems;  // one line each: "<key>: <what is wrong>"
  bool clean() const { return problems.empty(); }
};

class CubinCache {
 public:
  // Creates <root>/v1 if needed and probes it with a temp file; if that fails the cache is read-only
  // (writable() is false) and `warn` is told once.
  CubinCache(CacheOptions options, WarningSink warn);
  CubinCache(const CubinCache&) = delete;
  CubinCache& operator=(const CubinCache&) = delete;

  // Returns the entry for `key`, building it with `build` on a miss. `build` returns the cubin and the
  // manifest fields it knows (spec, names, resources...); the cache adds key, sha256, sizes, created.
  // `ptx` (may be empty) is stored beside the cubin.
  struct Built {
    std::vector<std::uint8_t> cubin;
    std::string ptx;
    nlohmann::json manifest;  // a JSON object (or null); the cache's own fields override same-named ones
  };
  // Throws Error(cache) for an invalid key or when another process holds the key's lock past
  // lock_timeout; exceptions from `build` propagate unchanged. A disk hit marks the entry used (LRU).
  Fetched get_or_build(const std::string& key, const std::function<Built()>& build);

  // Disk lookup without building (used by `attnplan cache explain`/tests). Quarantines bad entries.
  // Neither reads nor fills the in-memory map, and does not count as a use for LRU.
  std::shared_ptr<const Entry> find(const std::string& key);

  std::vector<EntryInfo> list() const;        // every key with a file on disk, sorted by key
  std::vector<EntryInfo> list_tiers() const;  // the same for each read-only tier, in tier order
  // The root (a read-only tier, else the directory) whose entry for `key` get_or_build would use, if
  // any; checks hashes like a lookup but changes nothing and warns about nothing.
  std::optional<std::filesystem::path> locate(const std::string& key) const;
  VerifyReport verify() const;                   // checks every entry's hash and manifest; changes nothing
  std::uint64_t prune(std::uint64_t max_bytes);  // LRU; returns bytes removed
  void clear();                                  // every entry, lock, temp file and quarantine; the map too
  // The PTX stored with `key`, if any and if it matches the SHA-256 its manifest records.
  std::optional<std::string> ptx(const std::string& key) const;

  const std::filesystem::path& directory() const { return options_.directory; }
  const std::vector<std::filesystem::path>& read_only_tiers() const { return options_.read_only_tiers; }
  std::filesystem::path entries_directory() const;     // <root>/v1
  std::filesystem::path quarantine_directory() const;  // <root>/v1/quarantine
  // Where `key`'s files live (whether or not they exist). Throw Error(cache) for an invalid key.
  std::filesystem::path cubin_path(const std::string& key) const;
  std::filesystem::path manifest_path(const std::string& key) const;
  std::filesystem::path ptx_path(const std::string& key) const;
  std::filesystem::path lock_path(const std::string& key) const;
  bool writable() const { return writable_; }

 private:
  struct DiskRead;
  DiskRead read_entry(const std::string& key) const;  // from the writable directory
  static DiskRead read_entry_in(const std::filesystem::path& entries, const std::string& key);
  // The first good entry for `key` in the read-only tiers; warns once per bad tier entry.
  std::optional<Fetched> read_tiers(const std::string& key);
  static void list_root(const std::filesystem::path& root, std::vector<EntryInfo>& infos);
  // Creates the key's shard directory and waits up to lock_timeout for its lock; nullopt on timeout.
  std::optional<core::FileLock> lock_key(const std::string& key);
  Error lock_timeout_error(const std::string& key) const;
  // With the key's lock held: reads the entry again, quarantining it if it is still bad.
  std::shared_ptr<const Entry> settle_locked(const std::string& key);
  void quarantine(const std::string& key, const std::string& reason);
  std::shared_ptr<const Entry> make_entry(const std::string& key, const std::function<Built()>& build,
                                          std::string& ptx) const;
  bool publish(const Entry& entry, const std::string& ptx);  // false (and warned once) on failure
  std::uint64_t prune_except(std::uint64_t max_bytes, const std::string& keep);
  void remember(const std::shared_ptr<const Entry>& entry);
  void warn(const std::string& message);
  void report_publish_failure(const std::string& reason);

  CacheOptions options_;
  WarningSink warn_;
  bool writable_ = true;  // decided in the constructor, never changed afterwards
  std::atomic<bool> publish_failure_reported_{false};

  std::mutex mutex_;  // guards memory_ and building_
  std::map<std::string, std::shared_ptr<const Entry>> memory_;
  std::set<std::string> building_;  // keys some thread of this process is looking up or building
  std::condition_variable building_done_;

  std::mutex warn_mutex_;
  std::set<std::filesystem::path> reported_tier_entries_;  // bad tier entries warned about; under warn_mutex_
};

}  // namespace attnplan::cache
