// Where the cache lives and which keys it accepts: keys become file names, so validation is what keeps a
// key from escaping the cache directory.
#include <filesystem>
#include <optional>
#include <string>

#include "cache/cubin_cache.hpp"
#include "cache_test_support.hpp"
#include "core/error.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;
using namespace attnplan::testing;
using cache::default_directory;

TEST_CASE("default_directory: ATTNPLAN_CACHE_DIR, then XDG_CACHE_HOME/attnplan, then HOME/.cache/attnplan",
          "[cache][layout]") {
  using std::nullopt;
  CHECK(default_directory("/explicit", "/xdg", "/home/u") == "/explicit");
  CHECK(default_directory("relative/dir", "/xdg", "/home/u") == "relative/dir");  // the user said so
  CHECK(default_directory(nullopt, "/xdg", "/home/u") == "/xdg/attnplan");
  CHECK(default_directory(nullopt, nullopt, "/home/u") == "/home/u/.cache/attnplan");
  // Empty values count as unset; a relative XDG_CACHE_HOME is invalid per the XDG spec and skipped.
  CHECK(default_directory("", "", "/home/u") == "/home/u/.cache/attnplan");
  CHECK(default_directory(nullopt, "relative/xdg", "/home/u") == "/home/u/.cache/attnplan");
  CHECK(default_directory(nullopt, nullopt, nullopt).empty());
  CHECK(default_directory("", nullopt, "").empty());
}

TEST_CASE("is_valid_key accepts exactly 64 lowercase hex digits", "[cache][layout]") {
  const std::string good = key_for("x");
  CHECK(cache::is_valid_key(good));
  CHECK(cache::is_valid_key(std::string(64, '0')));
  CHECK_FALSE(cache::is_valid_key(""));
  CHECK_FALSE(cache::is_valid_key(good.substr(0, 63)));
  CHECK_FALSE(cache::is_valid_key(good + "0"));
  std::string upper = good;
  upper[10] = 'A';
  CHECK_FALSE(cache::is_valid_key(upper));
  CHECK_FALSE(cache::is_valid_key("../" + good.substr(3)));
  CHECK_FALSE(cache::is_valid_key(good.substr(0, 30) + "/" + good.substr(31)));
  CHECK_FALSE(cache::is_valid_key(good.substr(0, 63) + std::string(1, '\0')));
  CHECK_FALSE(cache::is_valid_key(good.substr(0, 63) + "g"));
}

TEST_CASE("every cache operation rejects an invalid key with Error(cache) before touching the disk",
          "[cache][layout]") {
  TempDir dir;
  WarningLog warnings;
  cache::CubinCache cache(options_for(dir / "cache"), warnings.sink());
  const std::string escape = "../../../../../../tmp/" + std::string(43, 'a');
  bool built = false;
  auto build = [&] {
    built = true;
    return fake_built(escape);
  };
  for (const std::string& bad : {escape, std::string("ABCDEF"), std::string(), key_for("x") + "/"}) {
    INFO("key '" << bad << "'");
    try {
      cache.get_or_build(bad, build);
      FAIL("expected an Error");
    } catch (const Error& error) {
      CHECK(error.stage() == Stage::cache);
      CHECK(contains(error.message(), "invalid cache key"));
    }
    CHECK_THROWS_AS(cache.find(bad), Error);
    CHECK_THROWS_AS(cache.ptx(bad), Error);
    CHECK_THROWS_AS(cache.cubin_path(bad), Error);
    CHECK_THROWS_AS(cache.lock_path(bad), Error);
  }
  CHECK_FALSE(built);
  CHECK(warnings.count() == 0);
  // Nothing but the (empty) entries directory was created.
  CHECK(std::filesystem::is_empty(cache.entries_directory()));
}

TEST_CASE("an invalid key's message is printable and bounded", "[cache][layout]") {
  TempDir dir;
  cache::CubinCache cache(options_for(dir.path()), {});
  try {
    cache.find(std::string("bad\nkey") + std::string(500, 'z'));
    FAIL("expected an Error");
  } catch (const Error& error) {
    CHECK_FALSE(contains(error.message(), "\n"));
    CHECK(contains(error.message(), "bad\\x0akey"));
    CHECK(error.message().size() < 300);
  }
}

TEST_CASE("entry paths: <root>/v1/<first two hex digits>/<key>.<ext>", "[cache][layout]") {
  TempDir dir;
  cache::CubinCache cache(options_for(dir / "root"), {});
  const std::string key = key_for("paths");
  const auto shard = dir / "root" / "v1" / key.substr(0, 2);
  CHECK(cache.entries_directory() == dir / "root" / "v1");
  CHECK(cache.quarantine_directory() == dir / "root" / "v1" / "quarantine");
  CHECK(cache.cubin_path(key) == shard / (key + ".cubin"));
  CHECK(cache.manifest_path(key) == shard / (key + ".json"));
  CHECK(cache.ptx_path(key) == shard / (key + ".ptx"));
  CHECK(cache.lock_path(key) == shard / (key + ".lock"));
  CHECK(cache.directory() == dir / "root");
  CHECK(cache.writable());
}
