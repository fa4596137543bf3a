// A cache that cannot write: one warning, kernels still delivered (compiled in memory), existing
// entries still read. Tests run as root in CI, where chmod does not stop writes, so the main cases
// make writing fail in ways root cannot bypass (a path under a regular file, a directory in the way).
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

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

std::vector<std::filesystem::path> all_files(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> files;
  for (const auto& item : std::filesystem::recursive_directory_iterator(root)) files.push_back(item.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("a cache directory under a regular file: one warning, builds kept in memory",
          "[cache][unwritable]") {
  TempDir dir;
  core::write_file_atomic(dir / "file", std::string_view("not a directory"));
  const auto root = dir / "file" / "cache";
  WarningLog warnings;
  CubinCache cache(options_for(root), warnings.sink());
  CHECK_FALSE(cache.writable());
  REQUIRE(warnings.count() == 1);
  const std::string warning = warnings.messages()[0];
  CHECK(contains(warning, "cache directory " + root.string() + " is not writable"));
  CHECK(contains(warning, "Not a directory"));
  CHECK(contains(warning, "compiling in memory only"));

  int builds = 0;
  for (const char* name : {"one", "two", "three"}) {
    const std::string key = key_for(name);
    auto build = [&] {
      ++builds;
      return fake_built(key);
    };
    cache::Fetched first = cache.get_or_build(key, build);
    CHECK(first.lookup == Lookup::miss);
    CHECK(first.entry->cubin == fake_cubin(key));
    CHECK(first.entry->manifest.at("key") == key);
    CHECK(cache.get_or_build(key, build).lookup == Lookup::memory);
    CHECK(cache.find(key) == nullptr);
    CHECK_FALSE(cache.ptx(key).has_value());
  }
  CHECK(builds == 3);
  CHECK(cache.list().empty());
  CHECK(cache.verify().clean());
  CHECK(cache.prune(0) == 0);
  cache.clear();
  CHECK(warnings.count() == 1);
  CHECK(core::read_text_file(dir / "file") == "not a directory");
}

TEST_CASE("a cache that cannot write still reads the entries already there", "[cache][unwritable]") {
  TempDir dir;
  const std::string existing = key_for("existing");
  {
    CubinCache cache(options_for(dir.path()), {});
    cache.get_or_build(existing, [&] { return fake_built(existing); });
  }
  // The writability probe publishes <root>/v1/.writable-probe; a non-empty directory there makes that
  // rename fail even for root, standing in for a read-only file system.
  std::filesystem::create_directories(dir / "v1" / ".writable-probe" / "blocker");
  const auto before = all_files(dir.path());

  WarningLog warnings;
  CubinCache cache(options_for(dir.path()), warnings.sink());
  CHECK_FALSE(cache.writable());
  CHECK(warnings.count() == 1);

  int builds = 0;
  cache::Fetched hit = cache.get_or_build(existing, [&] {
    ++builds;
    return fake_built(existing);
  });
  CHECK(hit.lookup == Lookup::hit);
  CHECK(hit.entry->cubin == fake_cubin(existing));
  CHECK(builds == 0);
  CHECK(cache.list().size() == 1);
  CHECK(cache.find(existing));

  const std::string fresh = key_for("fresh");
  cache::Fetched miss = cache.get_or_build(fresh, [&] {
    ++builds;
    return fake_built(fresh);
  });
  CHECK(miss.lookup == Lookup::miss);
  CHECK(miss.entry->cubin == fake_cubin(fresh));
  CHECK(builds == 1);
  CHECK(all_files(dir.path()) == before);  // nothing was written
  CHECK(warnings.count() == 1);
}

TEST_CASE("a read-only directory (chmod 0555) as a non-root user", "[cache][unwritable]") {
  if (::geteuid() == 0) {
    WARN("skipped: root ignores directory permissions (the other unwritable tests cover this path)");
    return;
  }
  TempDir dir;
  const std::string existing = key_for("existing");
  {
    CubinCache cache(options_for(dir.path()), {});
    cache.get_or_build(existing, [&] { return fake_built(existing); });
  }
  const auto v1 = dir / "v1";
  std::filesystem::permissions(v1, std::filesystem::perms(0555));
  std::filesystem::permissions(v1 / existing.substr(0, 2), std::filesystem::perms(0555));

  WarningLog warnings;
  CubinCache cache(options_for(dir.path()), warnings.sink());
  CHECK_FALSE(cache.writable());
  REQUIRE(warnings.count() == 1);
  CHECK(contains(warnings.messages()[0], "not writable"));
  CHECK(cache.get_or_build(existing, [&] { return fake_built(existing); }).lookup == Lookup::hit);
  const std::string fresh = key_for("fresh");
  cache::Fetched miss = cache.get_or_build(fresh, [&] { return fake_built(fresh); });
  CHECK(miss.lookup == Lookup::miss);
  CHECK(miss.entry->cubin == fake_cubin(fresh));
  CHECK(warnings.count() == 1);
  std::filesystem::permissions(v1 / existing.substr(0, 2), std::filesystem::perms(0755));
  std::filesystem::permissions(v1, std::filesystem::perms(0755));
}

TEST_CASE("a publish that fails warns once, keeps the kernel in memory and leaves no debris",
          "[cache][unwritable]") {
  TempDir dir;
  WarningLog warnings;
  CubinCache cache(options_for(dir.path()), warnings.sink());
  REQUIRE(cache.writable());

  // The build puts a directory where one of the entry's files must go, so that a write fails after the
  // temp file was written (the rename), as a full disk would fail mid-publish.
  auto blocked_build = [&](const std::string& key, const std::filesystem::path& blocked) {
    return cache.get_or_build(key, [&, blocked] {
      std::filesystem::create_directories(blocked / "blocker");
      return fake_built(key, 4096, "some ptx");
    });
  };

  const std::string cubin_blocked = key_for("cubin blocked");
  cache::Fetched first = blocked_build(cubin_blocked, cache.cubin_path(cubin_blocked));
  CHECK(first.lookup == Lookup::miss);
  CHECK(first.entry->cubin == fake_cubin(cubin_blocked));
  REQUIRE(warnings.count() == 1);
  CHECK(contains(warnings.messages()[0], "cannot write to cache directory"));
  CHECK(contains(warnings.messages()[0], "in memory"));
  CHECK_FALSE(std::filesystem::exists(cache.manifest_path(cubin_blocked)));
  CHECK_FALSE(std::filesystem::exists(cache.ptx_path(cubin_blocked)));

  // Here the cubin and PTX were published before the manifest failed; they are removed again.
  const std::string manifest_blocked = key_for("manifest blocked");
  cache::Fetched second = blocked_build(manifest_blocked, cache.manifest_path(manifest_blocked));
  CHECK(second.entry->cubin == fake_cubin(manifest_blocked));
  CHECK_FALSE(std::filesystem::exists(cache.cubin_path(manifest_blocked)));
  CHECK_FALSE(std::filesystem::exists(cache.ptx_path(manifest_blocked)));
  CHECK(warnings.count() == 1);  // once per cache, not once per kernel

  CHECK(temp_files_under(dir.path()).empty());
  CHECK(cache.get_or_build(cubin_blocked, [&] { return fake_built(cubin_blocked); }).lookup ==
        Lookup::memory);

  // The failure was not taken as permanent: a later publish that can succeed does.
  const std::string fine = key_for("fine");
  CHECK(cache.get_or_build(fine, [&] { return fake_built(fine); }).lookup == Lookup::miss);
  CHECK(std::filesystem::exists(cache.manifest_path(fine)));
  CHECK(cache.writable());
}
