// Where the cache keeps things on disk, and a scan of what is there. Internal to cache/.
//
//   <root>/v1/<first two hex digits of key>/<key>.cubin   the binary
//                                           <key>.json    its manifest, published last
//                                           <key>.ptx     optional
//                                           <key>.lock    the per-key writer lock (flock)
//                                           .<name>.<pid>.<n>.tmp   a publish in progress
//   <root>/v1/quarantine/<key>.<UTC time>[-n].<ext>       bad entries, moved aside
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnplan::cache {

inline constexpr std::string_view kCubinExtension = ".cubin";
inline constexpr std::string_view kManifestExtension = ".json";
inline constexpr std::string_view kPtxExtension = ".ptx";
inline constexpr std::string_view kLockExtension = ".lock";
inline constexpr std::string_view kQuarantineName = "quarantine";

// Throws Error(cache) unless is_valid_key(key); the message shows the key escaped and shortened.
void require_valid_key(std::string_view key);

// <entries>/<key[0..2]>/<key><extension>; `key` must be valid.
std::filesystem::path entry_file(const std::filesystem::path& entries, std::string_view key,
                                 std::string_view extension);

struct StoredFile {
  std::filesystem::path path;
  std::uint64_t bytes = 0;
  std::filesystem::file_time_type mtime;
};

// The files of one key as found on disk; any of them may be missing.
struct StoredEntry {
  std::string key;
  std::filesystem::path shard;  // the directory they were found in (normally <entries>/<key[0..2]>)
  std::optional<StoredFile> cubin, manifest, ptx;
  std::optional<std::filesystem::path> lock;

  bool has_data() const { return cubin || manifest || ptx; }
  std::uint64_t bytes() const;
  // The manifest's mtime, which a disk hit refreshes; the cubin's when the manifest is missing.
  std::filesystem::file_time_type last_used() const;
};

struct StoreScan {
  std::vector<StoredEntry> entries;    // sorted by key; includes lock-only keys (has_data() false)
  std::vector<StoredFile> temp_files;  // leftovers of publishes in progress or interrupted
};

// Reads the shard directories under `entries`; a missing directory scans as empty. Files whose names
// are not <valid key>.<known extension> or a temp file are ignored.
StoreScan scan_store(const std::filesystem::path& entries);

}  // namespace attnplan::cache
