// Read-only cache tiers (ATTNPLAN_CACHE_PATH): consulted before the writable directory, verified like
// it, and never modified: no mtime refresh, no quarantine, no lock files.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "cache/cubin_cache.hpp"
#include "cache_test_support.hpp"
#include "core/files.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;
using namespace attnplan::testing;
using cache::CubinCache;
using cache::Lookup;

namespace {

// Path -> (bytes, mtime) of every file under `root`: a tier must compare equal before and after use.
struct FileState {
  std::string bytes;
  std::filesystem::file_time_type mtime;
  friend bool operator==(const FileState&, const FileState&) = default;
};
std::map<std::filesystem::path, FileState> snapshot(const std::filesystem::path& root) {
  std::map<std::filesystem::path, FileState> files;
  for (const auto& item : std::filesystem::recursive_directory_iterator(root)) {
    if (!item.is_regular_file()) continue;
    std::ifstream in(item.path(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    files[item.path()] = {std::move(bytes), item.last_write_time()};
  }
  return files;
}

// Publishes `key` into a cache rooted at `root` with a cubin of `size` bytes (sizes tell tiers apart).
void publish(const std::filesystem::path& root, const std::string& key, std::size_t size) {
  CubinCache cache(options_for(root), [](const std::string&) {});
  REQUIRE(cache.get_or_build(key, [&] { return fake_built(key, size); }).lookup == Lookup::miss);
}

cache::CacheOptions tiered(const std::filesystem::path& directory, std::vector<std::filesystem::path> tiers) {
  cache::CacheOptions options = options_for(directory);
  options.read_only_tiers = std::move(tiers);
  return options;
}

CubinCache::Built must_not_build() {
  FAIL("built although a tier holds the entry");
  return {};
}

}  // namespace

TEST_CASE("a read-only tier serves a hit and is never modified", "[cache][tiers]") {
  TempDir dir;
  const std::string key = key_for("prebuilt");
  publish(dir / "pack", key, 4096);
  // An mtime refresh within the clock's resolution could go unseen: age every file first.
  for (const auto& [path, state] : snapshot(dir / "pack")) {
    std::filesystem::last_write_time(path, state.mtime - std::chrono::hours(1));
  }
  const auto aged = snapshot(dir / "pack");

  WarningLog warnings;
  CubinCache cache(tiered(dir / "writable", {dir / "pack"}), warnings.sink());
  const cache::Fetched fetched = cache.get_or_build(key, must_not_build);
  CHECK(fetched.lookup == Lookup::prebuilt);
  CHECK(fetched.tier == dir / "pack");
  CHECK(fetched.entry->cubin == fake_cubin(key, 4096));
  CHECK(cache.get_or_build(key, must_not_build).lookup == Lookup::memory);
  CHECK(cache.locate(key) == dir / "pack");

  CHECK(snapshot(dir / "pack") == aged);  // same files, bytes and mtimes: no lock, no touch
  CHECK_FALSE(std::filesystem::exists(cache.manifest_path(key)));  // not copied into the writable dir
  CHECK(warnings.count() == 0);
  REQUIRE(cache.list_tiers().size() == 1);
  CHECK(cache.list_tiers().front().root == dir / "pack");
  CHECK(cache.list().empty());
}

TEST_CASE("a corrupted read-only entry is skipped with one warning and built into the writable dir",
          "[cache][tiers]") {
  TempDir dir;
  const std::string key = key_for("corrupted");
  publish(dir / "pack", key, 4096);
  CubinCache pack_view(options_for(dir / "pack"), [](const std::string&) {});
  const std::filesystem::path cubin = pack_view.cubin_path(key);
  {
    std::fstream stream(cubin, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(100);
    stream.put('\x5a');
  }
  const auto before = snapshot(dir / "pack");

  WarningLog warnings;
  {
    CubinCache cache(tiered(dir / "writable", {dir / "pack"}), warnings.sink());
    const cache::Fetched built = cache.get_or_build(key, [&] { return fake_built(key, 4096); });
    CHECK(built.lookup == Lookup::miss);
    CHECK(built.entry->cubin == fake_cubin(key, 4096));
    CHECK(std::filesystem::exists(cache.manifest_path(key)));  // published in the writable dir
    REQUIRE(warnings.count() == 1);
    CHECK(contains(warnings.all(), key));
    CHECK(contains(warnings.all(), (dir / "pack").string()));
    CHECK(cache.locate(key) == dir / "writable");
  }
  // A new process: the tier is still bad (one warning again), the writable dir serves the hit.
  CubinCache again(tiered(dir / "writable", {dir / "pack"}), warnings.sink());
  const cache::Fetched fetched = again.get_or_build(key, must_not_build);
  CHECK(fetched.lookup == Lookup::hit);
  CHECK(fetched.tier == dir / "writable");
  CHECK(warnings.count() == 2);

  CHECK(snapshot(dir / "pack") == before);  // not repaired, not quarantined
  CHECK_FALSE(std::filesystem::exists(dir / "pack" / "v1" / "quarantine"));
}

TEST_CASE("tiers are searched in order, all before the writable dir", "[cache][tiers]") {
  TempDir dir;
  const std::string key = key_for("everywhere");
  publish(dir / "first", key, 1000);
  publish(dir / "second", key, 2000);
  publish(dir / "writable", key, 3000);

  auto served_size = [&](std::vector<std::filesystem::path> tiers) {
    CubinCache cache(tiered(dir / "writable", std::move(tiers)), [](const std::string&) {});
    return cache.get_or_build(key, must_not_build).entry->cubin.size();
  };
  CHECK(served_size({dir / "first", dir / "second"}) == 1000);
  CHECK(served_size({dir / "second", dir / "first"}) == 2000);
  CHECK(served_size({dir / "missing", dir / "second"}) == 2000);  // a missing tier is just empty
  CHECK(served_size({}) == 3000);

  // A key only the writable dir has is a plain hit there.
  const std::string other = key_for("writable only");
  publish(dir / "writable", other, 500);
  CubinCache cache(tiered(dir / "writable", {dir / "first"}), [](const std::string&) {});
  CHECK(cache.get_or_build(other, must_not_build).lookup == Lookup::hit);
}

TEST_CASE("never_write reads the directory but writes nothing; rebuild ignores entries", "[cache][tiers]") {
  TempDir dir;
  const std::string key = key_for("policy");
  publish(dir / "pack", key, 4096);

  cache::CacheOptions read_only = tiered(dir / "absent", {dir / "pack"});
  read_only.never_write = true;
  CubinCache reader(read_only, [](const std::string&) {});
  CHECK(reader.get_or_build(key, must_not_build).lookup == Lookup::prebuilt);
  const std::string fresh = key_for("fresh");
  CHECK(reader.get_or_build(fresh, [&] { return fake_built(fresh); }).lookup == Lookup::miss);
  CHECK_FALSE(std::filesystem::exists(dir / "absent"));

  cache::CacheOptions rebuild = tiered(dir / "pack", {dir / "pack"});
  rebuild.rebuild = true;
  CubinCache rebuilder(rebuild, [](const std::string&) {});
  int builds = 0;
  auto build = [&] {
    ++builds;
    return fake_built(key, 4096);
  };
  CHECK(rebuilder.get_or_build(key, build).lookup == Lookup::miss);
  CHECK(rebuilder.get_or_build(key, build).lookup == Lookup::memory);  // once per process
  CHECK(builds == 1);
}
