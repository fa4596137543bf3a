// The cache's normal life: publish, hit from disk, hit from memory, manifests, PTX, list, prune, clear.
#include <chrono>
#include <ctime>
#include <filesystem>
#include <map>
#include <regex>
#include <stdexcept>
#include <string>

#include "cache/cubin_cache.hpp"
#include "cache/manifest.hpp"
#include "cache_test_support.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "core/sha256.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;
using namespace attnplan::testing;
using cache::CubinCache;
using cache::Lookup;

namespace {

// Fetches `key`, counting builds.
cache::Fetched fetch(CubinCache& cache, const std::string& key, int& builds, std::size_t size = 4096) {
  return cache.get_or_build(key, [&] {
    ++builds;
    return fake_built(key, size);
  });
}

void set_last_used(const CubinCache& cache, const std::string& key, std::chrono::seconds age) {
  std::filesystem::last_write_time(cache.manifest_path(key),
                                   std::filesystem::file_time_type::clock::now() - age);
}

}  // namespace

TEST_CASE("a miss builds and publishes; the same cache then serves memory; a new one hits disk", "[cache]") {
  TempDir dir;
  WarningLog warnings;
  const std::string key = key_for("publish");
  int builds = 0;
  {
    CubinCache cache(options_for(dir.path()), warnings.sink());
    CHECK(cache.writable());
    cache::Fetched first = fetch(cache, key, builds);
    CHECK(first.lookup == Lookup::miss);
    CHECK(builds == 1);
    CHECK(first.entry->key == key);
    CHECK(first.entry->cubin == fake_cubin(key));
    CHECK(std::filesystem::exists(cache.cubin_path(key)));
    CHECK(std::filesystem::exists(cache.manifest_path(key)));
    CHECK_FALSE(std::filesystem::exists(cache.ptx_path(key)));
    CHECK(core::read_binary_file(cache.cubin_path(key)) == fake_cubin(key));

    // Memory: no disk access at all, so even a deleted entry is still served.
    std::filesystem::remove(cache.cubin_path(key));
    cache::Fetched second = fetch(cache, key, builds);
    CHECK(second.lookup == Lookup::memory);
    CHECK(second.entry == first.entry);
    CHECK(builds == 1);
    core::write_file_atomic(cache.cubin_path(key), first.entry->cubin.data(), first.entry->cubin.size());
  }
  CubinCache reopened(options_for(dir.path()), warnings.sink());
  cache::Fetched third = fetch(reopened, key, builds);
  CHECK(third.lookup == Lookup::hit);
  CHECK(builds == 1);
  CHECK(third.entry->cubin == fake_cubin(key));
  CHECK(third.entry->manifest.at("name") == "rmsnorm");
  CHECK(fetch(reopened, key, builds).lookup == Lookup::memory);
  CHECK(warnings.count() == 0);
  CHECK(temp_files_under(dir.path()).empty());
}

TEST_CASE("the manifest holds the cache's fields and every field the build supplied", "[cache]") {
  TempDir dir;
  CubinCache cache(options_for(dir.path()), {});
  const std::string key = key_for("manifest");
  cache::CubinCache::Built built = fake_built(key, 1000);
  built.manifest["key"] = "a build cannot override the cache's own fields";
  built.manifest["cubin_bytes"] = 3;
  const auto before = std::chrono::system_clock::now();
  cache::Fetched fetched = cache.get_or_build(key, [&] { return built; });

  const nlohmann::json manifest = nlohmann::json::parse(core::read_text_file(cache.manifest_path(key)));
  CHECK(manifest == fetched.entry->manifest);
  CHECK(manifest.at("format_version") == cache::kFormatVersion);
  CHECK(manifest.at("key") == key);
  CHECK(manifest.at("cubin_bytes") == 1000);
  CHECK(manifest.at("cubin_sha256") == core::sha256_hex(built.cubin.data(), built.cubin.size()));
  CHECK_FALSE(manifest.contains("ptx_sha256"));
  const std::string created = manifest.at("created");
  CHECK(std::regex_match(created, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
  CHECK(created >= cache::iso8601_utc(before));
  CHECK(created <= cache::iso8601_utc(std::chrono::system_clock::now()));
  // Opaque to the cache, kept verbatim.
  for (const char* field :
       {"name", "spec", "lowered_name", "options", "arch", "nvrtc_version", "resources", "compile_ms"}) {
    INFO(field);
    CHECK(manifest.at(field) == built.manifest.at(field));
  }
}

TEST_CASE("PTX is stored beside the cubin and recorded in the manifest", "[cache]") {
  TempDir dir;
  CubinCache cache(options_for(dir.path()), {});
  const std::string with = key_for("with ptx");
  const std::string without = key_for("without ptx");
  const std::string ptx_text = ".version 9.0\n.target sm_90a\n";
  cache.get_or_build(with, [&] { return fake_built(with, 500, ptx_text); });
  cache.get_or_build(without, [&] { return fake_built(without, 500); });

  CHECK(cache.ptx(with) == ptx_text);
  CHECK(core::read_text_file(cache.ptx_path(with)) == ptx_text);
  CHECK(cache.find(with)->manifest.at("ptx_sha256") == core::sha256_hex(ptx_text));
  CHECK(cache.find(with)->manifest.at("ptx_bytes") == ptx_text.size());
  CHECK_FALSE(cache.ptx(without).has_value());
  CHECK_FALSE(cache.ptx(key_for("absent")).has_value());

  // A PTX that no longer matches its manifest is not handed out.
  core::write_file_atomic(cache.ptx_path(with), std::string_view("tampered"));
  CHECK_FALSE(cache.ptx(with).has_value());
  CHECK(cache.verify().problems.size() == 1);
}

TEST_CASE("find reads disk only and does not build", "[cache]") {
  TempDir dir;
  CubinCache cache(options_for(dir.path()), {});
  const std::string key = key_for("find");
  CHECK(cache.find(key) == nullptr);
  int builds = 0;
  fetch(cache, key, builds);
  auto found = cache.find(key);
  REQUIRE(found);
  CHECK(found->cubin == fake_cubin(key));
  std::filesystem::remove(cache.manifest_path(key));
  std::filesystem::remove(cache.cubin_path(key));
  CHECK(cache.find(key) == nullptr);                          // the memory map is not consulted
  CHECK(fetch(cache, key, builds).lookup == Lookup::memory);  // but get_or_build still uses it
}

TEST_CASE("a disk hit refreshes the manifest's mtime (last use for LRU)", "[cache]") {
  TempDir dir;
  const std::string key = key_for("touch");
  int builds = 0;
  {
    CubinCache cache(options_for(dir.path()), {});
    fetch(cache, key, builds);
    set_last_used(cache, key, std::chrono::hours(48));
  }
  CubinCache cache(options_for(dir.path()), {});
  const auto old_time = std::filesystem::last_write_time(cache.manifest_path(key));
  CHECK(cache.find(key));  // find is not a use
  CHECK(std::filesystem::last_write_time(cache.manifest_path(key)) == old_time);
  REQUIRE(cache.list().size() == 1);
  CHECK(cache.list()[0].last_used == old_time);

  CHECK(fetch(cache, key, builds).lookup == Lookup::hit);
  const auto new_time = std::filesystem::last_write_time(cache.manifest_path(key));
  CHECK(new_time > old_time + std::chrono::hours(47));
  CHECK(cache.list()[0].last_used == new_time);
}

TEST_CASE("list reports every entry with its size, manifest and last use", "[cache]") {
  TempDir dir;
  CubinCache cache(options_for(dir.path()), {});
  CHECK(cache.list().empty());
  int builds = 0;
  std::vector<std::string> keys = {key_for("a"), key_for("b"), key_for("c")};
  for (const std::string& key : keys) fetch(cache, key, builds, 1000);
  std::sort(keys.begin(), keys.end());

  const std::vector<cache::EntryInfo> infos = cache.list();
  REQUIRE(infos.size() == 3);
  for (std::size_t i = 0; i < infos.size(); ++i) {
    CHECK(infos[i].key == keys[i]);
    CHECK(infos[i].manifest.at("key") == keys[i]);
    CHECK(infos[i].bytes == 1000 + std::filesystem::file_size(cache.manifest_path(keys[i])));
  }
  // Lock files and stray files are not entries; an unreadable manifest leaves `manifest` null.
  core::write_file_atomic(cache.entries_directory() / keys[0].substr(0, 2) / "notes.txt",
                          std::string_view("x"));
  core::write_file_atomic(cache.manifest_path(keys[1]), std::string_view("{ not json"));
  const std::vector<cache::EntryInfo> again = cache.list();
  REQUIRE(again.size() == 3);
  CHECK(again[1].manifest.is_null());
}

TEST_CASE("prune removes least-recently-used entries first until the cache fits", "[cache][prune]") {
  TempDir dir;
  CubinCache cache(options_for(dir.path()), {});
  int builds = 0;
  // Oldest to newest use: d, b, a, c.
  const std::vector<std::pair<std::string, int>> ages = {{"a", 20}, {"b", 30}, {"c", 10}, {"d", 40}};
  for (const auto& [name, age] : ages) {
    fetch(cache, key_for(name), builds, 2000);
    set_last_used(cache, key_for(name), std::chrono::seconds(age * 60));
  }
  std::uint64_t total = 0;
  std::map<std::string, std::uint64_t> bytes;
  for (const cache::EntryInfo& info : cache.list()) {
    total += info.bytes;
    bytes[info.key] = info.bytes;
  }

  CHECK(cache.prune(total) == 0);  // already fits
  CHECK(cache.list().size() == 4);

  // One byte too many: only the oldest (d) goes.
  CHECK(cache.prune(total - 1) == bytes[key_for("d")]);
  CHECK_FALSE(std::filesystem::exists(cache.manifest_path(key_for("d"))));
  CHECK_FALSE(std::filesystem::exists(cache.cubin_path(key_for("d"))));
  CHECK_FALSE(std::filesystem::exists(cache.lock_path(key_for("d"))));
  CHECK(cache.list().size() == 3);

  // Room for one entry: b then a go, c (the newest) stays.
  CHECK(cache.prune(bytes[key_for("c")]) == bytes[key_for("b")] + bytes[key_for("a")]);
  const std::vector<cache::EntryInfo> left = cache.list();
  REQUIRE(left.size() == 1);
  CHECK(left[0].key == key_for("c"));

  CHECK(cache.prune(0) == bytes[key_for("c")]);
  CHECK(cache.list().empty());
  CHECK(cache.verify().clean());
}

TEST_CASE("a hit counts as a use: a recently read entry outlives a newer unread one", "[cache][prune]") {
  TempDir dir;
  int builds = 0;
  const std::string read_key = key_for("read");
  const std::string unread_key = key_for("unread");
  {
    CubinCache cache(options_for(dir.path()), {});
    fetch(cache, read_key, builds, 2000);
    fetch(cache, unread_key, builds, 2000);
    set_last_used(cache, read_key, std::chrono::hours(2));
    set_last_used(cache, unread_key, std::chrono::hours(1));
  }
  CubinCache cache(options_for(dir.path()), {});
  CHECK(fetch(cache, read_key, builds).lookup == Lookup::hit);
  const auto infos = cache.list();
  cache.prune(std::max(infos[0].bytes, infos[1].bytes));
  REQUIRE(cache.list().size() == 1);
  CHECK(cache.list()[0].key == read_key);
}

TEST_CASE("the size cap is enforced after each publish, never evicting the new entry", "[cache][prune]") {
  TempDir dir;
  int builds = 0;
  SECTION("room for about two entries") {
    // Each entry is a 3000-byte cubin plus a manifest of roughly 600 bytes.
    CubinCache cache(options_for(dir.path(), 8000), {});
    fetch(cache, key_for("first"), builds, 3000);
    set_last_used(cache, key_for("first"), std::chrono::minutes(30));
    fetch(cache, key_for("second"), builds, 3000);
    set_last_used(cache, key_for("second"), std::chrono::minutes(20));
    CHECK(cache.list().size() == 2);
    fetch(cache, key_for("third"), builds, 3000);
    const auto infos = cache.list();
    CHECK(infos.size() == 2);
    CHECK_FALSE(std::filesystem::exists(cache.manifest_path(key_for("first"))));
    CHECK(std::filesystem::exists(cache.manifest_path(key_for("second"))));
    CHECK(std::filesystem::exists(cache.manifest_path(key_for("third"))));
    std::uint64_t total = 0;
    for (const auto& info : infos) total += info.bytes;
    CHECK(total <= 8000);
  }
  SECTION("a cap smaller than one entry keeps just the newest") {
    CubinCache cache(options_for(dir.path(), 1), {});
    fetch(cache, key_for("first"), builds, 3000);
    fetch(cache, key_for("second"), builds, 3000);
    const auto infos = cache.list();
    REQUIRE(infos.size() == 1);
    CHECK(infos[0].key == key_for("second"));
  }
  SECTION("no cap") {
    CubinCache cache(options_for(dir.path(), 0), {});
    for (int i = 0; i < 5; ++i) fetch(cache, key_for(std::to_string(i)), builds, 3000);
    CHECK(cache.list().size() == 5);
  }
}

TEST_CASE("prune skips an entry whose lock is held and sweeps stale temp files", "[cache][prune]") {
  TempDir dir;
  CubinCache cache(options_for(dir.path()), {});
  int builds = 0;
  const std::string busy = key_for("busy");
  fetch(cache, busy, builds, 2000);
  auto held = core::FileLock::acquire(cache.lock_path(busy), std::chrono::milliseconds(0));
  REQUIRE(held);
  CHECK(cache.prune(0) == 0);
  CHECK(std::filesystem::exists(cache.manifest_path(busy)));
  held.reset();

  // A temp file from a publish that died an hour ago is swept; a fresh one (a publish in flight) is not.
  const auto shard = cache.entries_directory() / busy.substr(0, 2);
  core::write_file_atomic(shard / (".dead." + busy + ".cubin.1.0.tmp"), std::string(300, 'x'));
  core::write_file_atomic(shard / (".live." + busy + ".cubin.1.1.tmp"), std::string(200, 'x'));
  std::filesystem::last_write_time(shard / (".dead." + busy + ".cubin.1.0.tmp"),
                                   std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
  const std::uint64_t entry_bytes = cache.list().at(0).bytes;
  CHECK(cache.prune(1ull << 40) == 300);
  CHECK(std::filesystem::exists(shard / (".live." + busy + ".cubin.1.1.tmp")));
  CHECK(cache.prune(0) == entry_bytes);
}

TEST_CASE("clear removes every entry, lock, temp file and the quarantine, but not the root", "[cache]") {
  TempDir dir;
  const auto root = dir / "cache";
  CubinCache cache(options_for(root), {});
  int builds = 0;
  for (const char* name : {"x", "y", "z"}) fetch(cache, key_for(name), builds);
  core::write_file_atomic(cache.cubin_path(key_for("x")), std::string_view("corrupt"));
  CHECK(cache.find(key_for("x")) == nullptr);  // quarantined
  CHECK(std::filesystem::exists(cache.quarantine_directory()));

  cache.clear();
  CHECK(std::filesystem::is_directory(root));
  CHECK(cache.list().empty());
  CHECK_FALSE(std::filesystem::exists(cache.quarantine_directory()));
  for (auto it = std::filesystem::recursive_directory_iterator(root);
       it != std::filesystem::recursive_directory_iterator(); ++it) {
    INFO(it->path());
    CHECK(it->is_directory());  // only (empty) shard directories remain
  }
  // The memory map is cleared too: the next request builds again.
  CHECK(fetch(cache, key_for("y"), builds).lookup == Lookup::miss);
  CHECK(builds == 4);
}

TEST_CASE("a failing build propagates its exception and leaves nothing behind", "[cache]") {
  TempDir dir;
  WarningLog warnings;
  CubinCache cache(options_for(dir.path()), warnings.sink());
  const std::string key = key_for("fails");
  auto failing = [&]() -> CubinCache::Built { throw Error(Stage::compile, "nvrtc said no", "the log"); };
  try {
    cache.get_or_build(key, failing);
    FAIL("expected the build's Error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::compile);
    CHECK(error.payload() == "the log");
  }
  CHECK_FALSE(std::filesystem::exists(cache.manifest_path(key)));
  CHECK_FALSE(std::filesystem::exists(cache.cubin_path(key)));
  CHECK_FALSE(std::filesystem::exists(cache.lock_path(key)));  // no empty .lock for a key never built
  // The lock was released and the key is not stuck: a later build works.
  int builds = 0;
  CHECK(fetch(cache, key, builds).lookup == Lookup::miss);
  CHECK(builds == 1);

  // A build must return a cubin and an object-shaped manifest.
  const std::string empty_key = key_for("empty");
  CHECK_THROWS_AS(cache.get_or_build(empty_key, [] { return CubinCache::Built{}; }), Error);
  const std::string array_key = key_for("array");
  try {
    cache.get_or_build(array_key, [&] {
      CubinCache::Built built = fake_built(array_key);
      built.manifest = nlohmann::json::array({1, 2});
      return built;
    });
    FAIL("expected an Error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::internal);
  }
  CHECK(warnings.count() == 0);
  CHECK(cache.verify().clean());
}

TEST_CASE("an empty directory option means memory only, with one warning", "[cache]") {
  WarningLog warnings;
  CubinCache cache(options_for({}), warnings.sink());
  CHECK_FALSE(cache.writable());
  REQUIRE(warnings.count() == 1);
  CHECK(contains(warnings.messages()[0], "memory only"));
  int builds = 0;
  const std::string key = key_for("memory only");
  CHECK(fetch(cache, key, builds).lookup == Lookup::miss);
  CHECK(fetch(cache, key, builds).lookup == Lookup::memory);
  CHECK(builds == 1);
  CHECK(cache.find(key) == nullptr);
  CHECK(cache.list().empty());
  CHECK(cache.verify().checked == 0);
  CHECK(cache.prune(0) == 0);
  CHECK(warnings.count() == 1);
}
