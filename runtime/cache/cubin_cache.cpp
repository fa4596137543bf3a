#include "cache/cubin_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <ctime>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cache/layout.hpp"
#include "cache/manifest.hpp"
#include "core/error.hpp"
#include "core/files.hpp"

namespace attnplan::cache {
namespace {

// Temp files this old belong to a publish that died (a live one renames within seconds).
constexpr auto kStaleTempAge = std::chrono::hours(1);

bool exists_quietly(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::exists(path, error);
}

bool remove_quietly(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::remove(path, error);
}

// "20250131T123456Z": sortable, and free of the ':' that some tools mishandle in file names.
std::string compact_utc_now() {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

// The last-use time of an entry is its manifest's mtime, refreshed here on every disk hit. Rewriting
// the manifest instead would cost a publish per hit and race with other readers; a timestamp update
// is one syscall and atomic. Failure (a read-only cache) only makes LRU a little less accurate.
void mark_used(const std::filesystem::path& manifest) {
  ::utimensat(AT_FDCWD, manifest.c_str(), nullptr, 0);
}

// Probes `entries` by creating it and publishing a file the way entries are published.
// Returns why that failed, or an empty string.
std::string unwritable_reason(const std::filesystem::path& entries) {
  std::error_code error;
  std::filesystem::create_directories(entries, error);
  if (error) return error.message();
  const std::filesystem::path probe = entries / ".writable-probe";
  try {
    core::write_file_atomic(probe, std::string_view("probe\n"));
  } catch (const Error& failure) {
    return failure.message();
  }
  remove_quietly(probe);
  return {};
}

// Lets the next thread waiting for `key` proceed, however this one leaves get_or_build.
class BuildingGuard {
 public:
  BuildingGuard(std::mutex& mutex, std::set<std::string>& building, std::condition_variable& done,
                const std::string& key)
      : mutex_(mutex), building_(building), done_(done), key_(key) {}
  ~BuildingGuard() {
    {
      std::lock_guard lock(mutex_);
      building_.erase(key_);
    }
    done_.notify_all();
  }
  BuildingGuard(const BuildingGuard&) = delete;
  BuildingGuard& operator=(const BuildingGuard&) = delete;

 private:
  std::mutex& mutex_;
  std::set<std::string>& building_;
  std::condition_variable& done_;
  const std::string& key_;
};

}  // namespace

// The outcome of reading one entry from disk without any lock.
struct CubinCache::DiskRead {
  enum class State { absent, found, bad };
  State state = State::absent;
  std::shared_ptr<const Entry> entry;  // found
  std::string problem;                 // bad

  static DiskRead bad(std::string problem) { return {State::bad, nullptr, std::move(problem)}; }
};

CubinCache::CubinCache(CacheOptions options, WarningSink warn)
    : options_(std::move(options)), warn_(std::move(warn)) {
  if (options_.directory.empty()) {
    writable_ = false;
    this->warn(
        "no cache directory is known (ATTNPLAN_CACHE_DIR, XDG_CACHE_HOME and HOME are unset); compiling in "
        "memory only");
    return;
  }
  if (options_.never_write) {
    // Asked for (ATTNPLAN_JIT=read-only), so not worth a warning; the probe itself would write.
    writable_ = false;
    return;
  }
  const std::string reason = unwritable_reason(entries_directory());
  if (!reason.empty()) {
    writable_ = false;
    this->warn(fmt::format("cache directory {} is not writable ({}); compiling in memory only",
                           options_.directory.string(), reason));
  }
}

std::filesystem::path CubinCache::entries_directory() const {
  return options_.directory / fmt::format("v{}", kFormatVersion);
}

std::filesystem::path CubinCache::quarantine_directory() const {
  return entries_directory() / std::string(kQuarantineName);
}

std::filesystem::path CubinCache::cubin_path(const std::string& key) const {
  require_valid_key(key);
  return entry_file(entries_directory(), key, kCubinExtension);
}

std::filesystem::path CubinCache::manifest_path(const std::string& key) const {
  require_valid_key(key);
  return entry_file(entries_directory(), key, kManifestExtension);
}

std::filesystem::path CubinCache::ptx_path(const std::string& key) const {
  require_valid_key(key);
  return entry_file(entries_directory(), key, kPtxExtension);
}

std::filesystem::path CubinCache::lock_path(const std::string& key) const {
  require_valid_key(key);
  return entry_file(entries_directory(), key, kLockExtension);
}

void CubinCache::warn(const std::string& message) {
  if (!warn_) return;
  std::lock_guard lock(warn_mutex_);
  warn_(message);
}

void CubinCache::report_publish_failure(const std::string& reason) {
  // Once per cache: a full disk would otherwise produce one identical warning per kernel.
  if (publish_failure_reported_.exchange(true)) return;
  warn(fmt::format("cannot write to cache directory {} ({}); keeping compiled kernels in memory only",
                   options_.directory.string(), reason));
}

void CubinCache::remember(const std::shared_ptr<const Entry>& entry) {
  std::lock_guard lock(mutex_);
  memory_.insert_or_assign(entry->key, entry);
}

// Readers start from the manifest because it is published last: if it is present and matches, the
// cubin it describes was complete before the manifest appeared. Every inconsistency is reported as
// `bad`, including ones a concurrent publish, prune or quarantine can cause for an instant; callers
// settle those by reading again under the key's lock.
CubinCache::DiskRead CubinCache::read_entry(const std::string& key) const {
  return read_entry_in(entries_directory(), key);
}

CubinCache::DiskRead CubinCache::read_entry_in(const std::filesystem::path& entries, const std::string& key) {
  const std::filesystem::path manifest_file = entry_file(entries, key, kManifestExtension);
  const std::filesystem::path cubin_file = entry_file(entries, key, kCubinExtension);
  const bool has_manifest = exists_quietly(manifest_file);
  const bool has_cubin = exists_quietly(cubin_file);
  if (!has_manifest && !has_cubin) return {};
  if (!has_manifest) return DiskRead::bad("the manifest is missing (only the cubin is there)");

  std::string text;
  try {
    text = core::read_text_file(manifest_file);
  } catch (const Error& error) {
    return DiskRead::bad(error.message());
  }
  ParsedManifest manifest = parse_manifest(text, key);
  if (!manifest.problem.empty()) return DiskRead::bad(manifest.problem);

  std::vector<std::uint8_t> cubin;
  try {
    cubin = core::read_binary_file(cubin_file);
  } catch (const Error& error) {
    return DiskRead::bad(exists_quietly(cubin_file) ? error.message() : "the cubin is missing");
  }
  if (std::string problem = cubin_problem(manifest.json, cubin); !problem.empty()) {
    return DiskRead::bad(std::move(problem));
  }
  auto entry = std::make_shared<Entry>();
  entry->key = key;
  entry->cubin = std::move(cubin);
  entry->manifest = std::move(manifest.json);
  return {DiskRead::State::found, std::move(entry), {}};
}

std::optional<Fetched> CubinCache::read_tiers(const std::string& key) {
  for (const std::filesystem::path& tier : options_.read_only_tiers) {
    const std::filesystem::path entries = tier / fmt::format("v{}", kFormatVersion);
    DiskRead read = read_entry_in(entries, key);
    if (read.state == DiskRead::State::found) return Fetched{read.entry, Lookup::prebuilt, tier};
    if (read.state != DiskRead::State::bad) continue;
    // A pack is someone else's (an image, a shared mount): it is never repaired from here, so one
    // warning per entry is all the user can act on; the next tier or the writable directory serves it.
    const std::filesystem::path manifest = entry_file(entries, key, kManifestExtension);
    std::lock_guard lock(warn_mutex_);
    if (reported_tier_entries_.insert(manifest).second && warn_) {
      warn_(fmt::format("read-only cache entry {} in {} is bad ({}); skipping it", key, tier.string(),
                        read.problem));
    }
  }
  return std::nullopt;
}

std::optional<std::filesystem::path> CubinCache::locate(const std::string& key) const {
  require_valid_key(key);
  for (const std::filesystem::path& tier : options_.read_only_tiers) {
    if (read_entry_in(tier / fmt::format("v{}", kFormatVersion), key).state == DiskRead::State::found) {
      return tier;
    }
  }
  if (!options_.directory.empty() && read_entry(key).state == DiskRead::State::found)
    return options_.directory;
  return std::nullopt;
}

std::optional<core::FileLock> CubinCache::lock_key(const std::string& key) {
  const std::filesystem::path path = lock_path(key);
  std::error_code error;
  std::filesystem::create_directories(path.parent_path(), error);
  if (error) {
    throw Error(Stage::cache,
                fmt::format("cannot create {}: {}", path.parent_path().string(), error.message()));
  }
  return core::FileLock::acquire(path, options_.lock_timeout);
}

Error CubinCache::lock_timeout_error(const std::string& key) const {
  return Error(Stage::cache,
               fmt::format("timed out after {} ms waiting for the cache lock {} (another process is building "
                           "or repairing entry {})",
                           options_.lock_timeout.count(), lock_path(key).string(), key),
               {},
               {"a process that dies releases its locks; a live one still holds this lock",
                "raise the lock timeout if compiles are this slow"});
}

void CubinCache::quarantine(const std::string& key, const std::string& reason) {
  const std::filesystem::path directory = quarantine_directory();
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  // <key>.<time> names one quarantine event; a suffix keeps two events in the same second apart.
  std::string base = fmt::format("{}.{}", key, compact_utc_now());
  for (int suffix = 1; exists_quietly(directory / (base + std::string(kManifestExtension))) ||
                       exists_quietly(directory / (base + std::string(kCubinExtension))) ||
                       exists_quietly(directory / (base + ".txt"));
       ++suffix) {
    base = fmt::format("{}.{}-{}", key, compact_utc_now(), suffix);
  }
  std::vector<std::string> failures;
  // The manifest goes first, so that readers stop seeing the entry at once.
  for (std::string_view extension : {kManifestExtension, kCubinExtension, kPtxExtension}) {
    const std::filesystem::path from = entry_file(entries_directory(), key, extension);
    if (!exists_quietly(from)) continue;
    std::filesystem::rename(from, directory / (base + std::string(extension)), error);
    if (error) {
      // Deleting still lets the entry be rebuilt; only the evidence is lost.
      failures.push_back(fmt::format("{}: {}", from.filename().string(), error.message()));
      remove_quietly(from);
    }
  }
  if (failures.empty()) {
    try {
      core::write_file_atomic(directory / (base + ".txt"), fmt::format("{}\n{}\n", key, reason));
    } catch (const Error&) {
      // The note is a courtesy for whoever inspects quarantine/; the warning below carries the reason.
    }
    warn(fmt::format("cache entry {} is bad ({}); moved it to {}.*", key, reason,
                     (directory / base).string()));
  } else {
    warn(fmt::format("cache entry {} is bad ({}); could not move it to {} ({}), removed it instead", key,
                     reason, directory.string(), fmt::join(failures, "; ")));
  }
}

std::shared_ptr<const Entry> CubinCache::settle_locked(const std::string& key) {
  DiskRead read = read_entry(key);
  if (read.state == DiskRead::State::found) return read.entry;
  if (read.state == DiskRead::State::bad) quarantine(key, read.problem);
  return nullptr;
}

std::shared_ptr<const Entry> CubinCache::make_entry(const std::string& key,
                                                    const std::function<Built()>& build,
                                                    std::string& ptx) const {
  Built built = build();
  if (built.cubin.empty()) {
    throw Error(Stage::internal, fmt::format("the build of cache entry {} returned an empty cubin", key));
  }
  auto entry = std::make_shared<Entry>();
  entry->key = key;
  entry->manifest =
      compose_manifest(key, built.cubin, built.ptx, built.manifest, std::chrono::system_clock::now());
  entry->cubin = std::move(built.cubin);
  ptx = std::move(built.ptx);
  return entry;
}

bool CubinCache::publish(const Entry& entry, const std::string& ptx) {
  const std::filesystem::path cubin_file = cubin_path(entry.key);
  const std::filesystem::path ptx_file = ptx_path(entry.key);
  const std::filesystem::path manifest_file = manifest_path(entry.key);
  try {
    // Payloads first, manifest last: a reader that finds the manifest finds everything it describes.
    core::write_file_atomic(cubin_file, entry.cubin.data(), entry.cubin.size());
    if (ptx.empty()) {
      remove_quietly(ptx_file);  // a leftover from an older entry would not match this manifest
    } else {
      core::write_file_atomic(ptx_file, ptx);
    }
    core::write_file_atomic(manifest_file, entry.manifest.dump(2) + "\n");
    return true;
  } catch (const Error& error) {
    // No half entry is left behind: the key's lock is still held, so these are this publish's files.
    for (const auto* path : {&manifest_file, &cubin_file, &ptx_file}) remove_quietly(*path);
    report_publish_failure(error.message());
    return false;
  }
}

Fetched CubinCache::get_or_build(const std::string& key, const std::function<Built()>& build) {
  require_valid_key(key);
  {
    // One thread per key past this point: the others wait here and then find the entry in memory
    // (or, if that build failed, take their own turn).
    std::unique_lock lock(mutex_);
    for (;;) {
      if (auto found = memory_.find(key); found != memory_.end()) return {found->second, Lookup::memory};
      if (building_.insert(key).second) break;
      building_done_.wait(lock);
    }
  }
  BuildingGuard building(mutex_, building_, building_done_, key);

  if (!options_.rebuild) {
    if (std::optional<Fetched> prebuilt = read_tiers(key)) {
      remember(prebuilt->entry);
      return *prebuilt;
    }
  }

  if (options_.directory.empty()) {
    std::string ptx;
    auto entry = make_entry(key, build, ptx);
    remember(entry);
    return {entry, Lookup::miss};
  }

  DiskRead read;  // stays absent when rebuilding: whatever is on disk is to be replaced
  if (!options_.rebuild) read = read_entry(key);
  if (read.state == DiskRead::State::found) {
    if (writable_) mark_used(manifest_path(key));
    remember(read.entry);
    return {read.entry, Lookup::hit, options_.directory};
  }

  if (!writable_) {
    if (read.state == DiskRead::State::bad) {
      warn(
          fmt::format("cache entry {} is bad ({}); the cache directory is {}, so it stays and the kernel is "
                      "compiled in memory",
                      key, read.problem, options_.never_write ? "used read-only" : "not writable"));
    }
    std::string ptx;
    auto entry = make_entry(key, build, ptx);
    remember(entry);
    return {entry, Lookup::miss};
  }

  std::optional<core::FileLock> file_lock;
  try {
    file_lock = lock_key(key);
  } catch (const Error& error) {
    // The directory stopped being writable after the probe (or the lock file is off limits): the
    // caller still gets its kernel, compiled in memory.
    report_publish_failure(error.message());
    std::string ptx;
    auto entry = make_entry(key, build, ptx);
    remember(entry);
    return {entry, Lookup::miss};
  }
  if (!file_lock) throw lock_timeout_error(key);

  // Re-check under the lock: another process may have published this key (or repaired it) while we
  // waited, and a bad entry is quarantined only while no writer can be halfway through it.
  if (!options_.rebuild) {
    if (auto entry = settle_locked(key)) {
      mark_used(manifest_path(key));
      remember(entry);
      return {entry, Lookup::hit, options_.directory};
    }
  }
  std::string ptx;
  std::shared_ptr<const Entry> entry;
  try {
    entry = make_entry(key, build, ptx);
  } catch (...) {
    // Nothing will be published (a compile error, or JitPolicy::off finding the kernel nowhere), so the
    // lock file is debris: remove it while still held, as prune does for lock-only keys. A process that
    // opened it just before locks an orphan inode and may build once more, which rename makes harmless.
    remove_quietly(lock_path(key));
    throw;
  }
  const bool published = publish(*entry, ptx);
  // A failed publish (a full disk) leaves no entry, so its lock file would be the only debris.
  if (!published) remove_quietly(lock_path(key));
  file_lock.reset();  // pruning below takes other keys' locks; this one is not needed any more
  remember(entry);
  if (published && options_.max_bytes > 0) prune_except(options_.max_bytes, key);
  return {entry, Lookup::miss};
}

std::shared_ptr<const Entry> CubinCache::find(const std::string& key) {
  require_valid_key(key);
  if (options_.directory.empty()) return nullptr;
  DiskRead read = read_entry(key);
  if (read.state != DiskRead::State::bad) return read.entry;
  if (!writable_) {
    warn(fmt::format("cache entry {} is bad ({}); the cache directory is {}, so it stays", key, read.problem,
                     options_.never_write ? "used read-only" : "not writable"));
    return nullptr;
  }
  std::optional<core::FileLock> file_lock = lock_key(key);
  if (!file_lock) throw lock_timeout_error(key);
  return settle_locked(key);
}

std::vector<EntryInfo> CubinCache::list() const {
  std::vector<EntryInfo> infos;
  if (options_.directory.empty()) return infos;
  list_root(options_.directory, infos);
  return infos;
}

std::vector<EntryInfo> CubinCache::list_tiers() const {
  std::vector<EntryInfo> infos;
  for (const std::filesystem::path& tier : options_.read_only_tiers) list_root(tier, infos);
  return infos;
}

void CubinCache::list_root(const std::filesystem::path& root, std::vector<EntryInfo>& infos) {
  for (const StoredEntry& stored : scan_store(root / fmt::format("v{}", kFormatVersion)).entries) {
    if (!stored.has_data()) continue;
    EntryInfo info;
    info.key = stored.key;
    info.root = root;
    info.bytes = stored.bytes();
    info.last_used = stored.last_used();
    if (stored.manifest) {
      try {
        info.manifest = nlohmann::json::parse(core::read_text_file(stored.manifest->path), nullptr, false);
        if (info.manifest.is_discarded()) info.manifest = nullptr;
      } catch (const Error&) {
        info.manifest = nullptr;
      }
    }
    infos.push_back(std::move(info));
  }
}

VerifyReport CubinCache::verify() const {
  VerifyReport report;
  if (options_.directory.empty()) return report;
  const std::filesystem::path entries = entries_directory();
  for (const StoredEntry& stored : scan_store(entries).entries) {
    if (!stored.has_data()) continue;
    ++report.checked;
    auto problem = [&](const std::string& what) { report.problems.push_back(stored.key + ": " + what); };
    const std::filesystem::path expected_shard = entry_file(entries, stored.key, "").parent_path();
    if (stored.shard != expected_shard) {
      problem(fmt::format("stored in {} instead of {}", stored.shard.string(), expected_shard.string()));
      continue;
    }
    if (!stored.manifest) {
      problem("the manifest is missing");
      continue;
    }
    ParsedManifest manifest;
    try {
      manifest = parse_manifest(core::read_text_file(stored.manifest->path), stored.key);
    } catch (const Error& error) {
      manifest.problem = error.message();
    }
    if (!manifest.problem.empty()) {
      problem(manifest.problem);
      continue;
    }
    if (!stored.cubin) {
      problem("the cubin is missing");
    } else {
      try {
        if (std::string what = cubin_problem(manifest.json, core::read_binary_file(stored.cubin->path));
            !what.empty()) {
          problem(what);
        }
      } catch (const Error& error) {
        problem(error.message());
      }
    }
    if (manifest.json.contains("ptx_sha256")) {
      if (!stored.ptx) {
        problem("the PTX the manifest records is missing");
      } else {
        try {
          if (std::string what = ptx_problem(manifest.json, core::read_text_file(stored.ptx->path));
              !what.empty()) {
            problem(what);
          }
        } catch (const Error& error) {
          problem(error.message());
        }
      }
    } else if (stored.ptx) {
      problem("a PTX file is present but the manifest records none");
    }
  }
  return report;
}

std::uint64_t CubinCache::prune(std::uint64_t max_bytes) {
  return prune_except(max_bytes, {});
}

std::uint64_t CubinCache::prune_except(std::uint64_t max_bytes, const std::string& keep) {
  if (options_.directory.empty()) return 0;
  StoreScan scan = scan_store(entries_directory());
  std::uint64_t removed = 0;
  const auto stale_before = std::filesystem::file_time_type::clock::now() - kStaleTempAge;
  for (const StoredFile& temp : scan.temp_files) {
    if (temp.mtime < stale_before && remove_quietly(temp.path)) removed += temp.bytes;
  }

  std::uint64_t total = 0;
  std::vector<const StoredEntry*> order;
  for (const StoredEntry& stored : scan.entries) {
    total += stored.bytes();
    order.push_back(&stored);
  }
  // Oldest use first; the key breaks ties so that equal timestamps prune in a repeatable order.
  std::sort(order.begin(), order.end(), [](const StoredEntry* a, const StoredEntry* b) {
    return std::pair(a->last_used(), a->key) < std::pair(b->last_used(), b->key);
  });
  for (const StoredEntry* stored : order) {
    const bool over_cap = total > max_bytes;
    // Lock-only keys cost no bytes but are swept too, so lock files do not pile up forever.
    if (!over_cap && stored->has_data()) continue;
    if (stored->key == keep) continue;
    const std::filesystem::path lock_file = stored->shard / (stored->key + std::string(kLockExtension));
    // A held lock means a writer is publishing or repairing this key right now: leave it alone.
    std::optional<core::FileLock> lock;
    try {
      lock = core::FileLock::acquire(lock_file, std::chrono::milliseconds(0));
    } catch (const Error&) {
      continue;  // no lock file can be created here, so nothing can be removed either
    }
    if (!lock) continue;
    // Manifest first: the entry disappears for readers in one step, before its payloads go.
    for (const auto* file : {&stored->manifest, &stored->cubin, &stored->ptx}) {
      if (*file && remove_quietly((*file)->path)) removed += (*file)->bytes;
    }
    total -= stored->bytes();
    // Removed while held: a process that opened the old file just before locks an orphan inode and
    // may build the key once more than needed, which publish-by-rename makes harmless.
    remove_quietly(lock_file);
  }
  return removed;
}

void CubinCache::clear() {
  {
    std::lock_guard lock(mutex_);
    memory_.clear();
  }
  if (options_.directory.empty()) return;
  // Shard directories stay: removing one could pull it from under a concurrent writer's lock file.
  StoreScan scan = scan_store(entries_directory());
  for (const StoredEntry& stored : scan.entries) {
    for (const auto* file : {&stored.manifest, &stored.cubin, &stored.ptx}) {
      if (*file) remove_quietly((*file)->path);
    }
    if (stored.lock) remove_quietly(*stored.lock);
  }
  for (const StoredFile& temp : scan.temp_files) remove_quietly(temp.path);
  std::error_code error;
  std::filesystem::remove_all(quarantine_directory(), error);
}

std::optional<std::string> CubinCache::ptx(const std::string& key) const {
  require_valid_key(key);
  if (options_.directory.empty()) return std::nullopt;
  try {
    ParsedManifest manifest = parse_manifest(core::read_text_file(manifest_path(key)), key);
    if (!manifest.problem.empty() || !manifest.json.contains("ptx_sha256")) return std::nullopt;
    std::string text = core::read_text_file(ptx_path(key));
    if (!ptx_problem(manifest.json, text).empty()) return std::nullopt;
    return text;
  } catch (const Error&) {
    return std::nullopt;  // missing or unreadable: verify() is where such problems are reported
  }
}

}  // namespace attnplan::cache
