// Damaged entries: each kind of damage is found on load, moved to quarantine/, reported once, and
// rebuilt, and the caller still gets the right bytes. verify() finds the same problems without fixing them.
#include <filesystem>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "cache/cubin_cache.hpp"
#include "cache_test_support.hpp"
#include "core/files.hpp"
#include "core/sha256.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;
using namespace attnplan::testing;
using cache::CubinCache;
using cache::Lookup;

namespace {

struct Damage {
  std::string name;
  std::string reason;  // a phrase the warning and verify() must contain
  std::function<void(const CubinCache&, const std::string&)> apply;
};

nlohmann::json read_manifest(const CubinCache& cache, const std::string& key) {
  return nlohmann::json::parse(core::read_text_file(cache.manifest_path(key)));
}

void write_manifest(const CubinCache& cache, const std::string& key, const nlohmann::json& manifest) {
  core::write_file_atomic(cache.manifest_path(key), manifest.dump(2));
}

std::vector<Damage> all_damages() {
  return {
      {"flipped byte in the cubin", "SHA-256",
       [](const CubinCache& cache, const std::string& key) {
         std::vector<std::uint8_t> bytes = core::read_binary_file(cache.cubin_path(key));
         bytes[bytes.size() / 2] ^= 0x01;
         core::write_file_atomic(cache.cubin_path(key), bytes.data(), bytes.size());
       }},
      {"truncated cubin", "bytes but the manifest records",
       [](const CubinCache& cache, const std::string& key) {
         std::filesystem::resize_file(cache.cubin_path(key), 100);
       }},
      {"manifest records another hash", "SHA-256",
       [](const CubinCache& cache, const std::string& key) {
         nlohmann::json manifest = read_manifest(cache, key);
         manifest["cubin_sha256"] = core::sha256_hex("something else");
         write_manifest(cache, key, manifest);
       }},
      {"manifest names another key", "manifest names key",
       [](const CubinCache& cache, const std::string& key) {
         nlohmann::json manifest = read_manifest(cache, key);
         manifest["key"] = key_for("another");
         write_manifest(cache, key, manifest);
       }},
      {"manifest of another format version", "format_version",
       [](const CubinCache& cache, const std::string& key) {
         nlohmann::json manifest = read_manifest(cache, key);
         manifest["format_version"] = cache::kFormatVersion + 1;
         write_manifest(cache, key, manifest);
       }},
      {"unparsable manifest", "not valid JSON",
       [](const CubinCache& cache, const std::string& key) {
         std::string text = core::read_text_file(cache.manifest_path(key));
         core::write_file_atomic(cache.manifest_path(key), text.substr(0, text.size() / 2));
       }},
      {"missing manifest", "manifest is missing",
       [](const CubinCache& cache, const std::string& key) {
         std::filesystem::remove(cache.manifest_path(key));
       }},
      {"missing cubin", "cubin is missing",
       [](const CubinCache& cache, const std::string& key) {
         std::filesystem::remove(cache.cubin_path(key));
       }},
  };
}

std::vector<std::string> quarantined_files(const CubinCache& cache, const std::string& key) {
  std::vector<std::string> names;
  if (!std::filesystem::exists(cache.quarantine_directory())) return names;
  for (const auto& item : std::filesystem::directory_iterator(cache.quarantine_directory())) {
    const std::string name = item.path().filename().string();
    if (name.starts_with(key)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Path -> (size, mtime) of everything under `root`, to prove an operation changed nothing.
std::map<std::string, std::pair<std::uintmax_t, std::filesystem::file_time_type>> snapshot(
    const std::filesystem::path& root) {
  std::map<std::string, std::pair<std::uintmax_t, std::filesystem::file_time_type>> files;
  for (const auto& item : std::filesystem::recursive_directory_iterator(root)) {
    if (item.is_regular_file()) files[item.path().string()] = {item.file_size(), item.last_write_time()};
  }
  return files;
}

}  // namespace

TEST_CASE("each kind of damage is quarantined, warned about once, rebuilt, and the right bytes returned",
          "[cache][corruption]") {
  for (const Damage& damage : all_damages()) {
    INFO(damage.name);
    TempDir dir;
    const std::string key = key_for("victim");
    const std::string bystander = key_for("bystander");
    {
      CubinCache cache(options_for(dir.path()), {});
      cache.get_or_build(key, [&] { return fake_built(key); });
      cache.get_or_build(bystander, [&] { return fake_built(bystander); });
      damage.apply(cache, key);
    }
    WarningLog warnings;
    CubinCache cache(options_for(dir.path()), warnings.sink());
    int builds = 0;
    cache::Fetched fetched = cache.get_or_build(key, [&] {
      ++builds;
      return fake_built(key);
    });
    CHECK(fetched.lookup == Lookup::miss);
    CHECK(builds == 1);
    CHECK(fetched.entry->cubin == fake_cubin(key));

    REQUIRE(warnings.count() == 1);
    const std::string warning = warnings.messages()[0];
    CHECK(contains(warning, key));
    CHECK(contains(warning, damage.reason));
    CHECK(contains(warning, "quarantine"));

    // What was there is kept for inspection, with a note saying why.
    const std::vector<std::string> moved = quarantined_files(cache, key);
    CHECK(moved.size() >= 2);
    for (const std::string& name : moved) {
      INFO(name);
      CHECK(std::regex_match(name, std::regex(key + R"(\.\d{8}T\d{6}Z\.(cubin|json|ptx|txt))")));
    }
    CHECK(quarantined_files(cache, bystander).empty());

    // The rebuilt entry is sound on disk, and the bystander was never touched.
    CHECK(cache.verify().clean());
    CHECK(cache.verify().checked == 2);
    CubinCache reopened(options_for(dir.path()), warnings.sink());
    CHECK(reopened.get_or_build(key, [&] { return fake_built(key); }).lookup == Lookup::hit);
    CHECK(reopened.get_or_build(bystander, [&] { return fake_built(bystander); }).lookup == Lookup::hit);
    CHECK(warnings.count() == 1);
    CHECK(temp_files_under(dir.path()).empty());
  }
}

TEST_CASE("find quarantines a damaged entry and returns nothing", "[cache][corruption]") {
  TempDir dir;
  WarningLog warnings;
  CubinCache cache(options_for(dir.path()), warnings.sink());
  const std::string key = key_for("find me");
  cache.get_or_build(key, [&] { return fake_built(key); });
  all_damages()[0].apply(cache, key);
  CHECK(cache.find(key) == nullptr);
  CHECK(warnings.count() == 1);
  CHECK_FALSE(std::filesystem::exists(cache.manifest_path(key)));
  CHECK(cache.find(key) == nullptr);  // now simply absent: no second warning
  CHECK(warnings.count() == 1);
}

TEST_CASE("two quarantines of one key in the same second keep both", "[cache][corruption]") {
  TempDir dir;
  const std::string key = key_for("twice");
  for (int round = 0; round < 2; ++round) {
    CubinCache cache(options_for(dir.path()), {});  // fresh, so that the entry is built and published again
    cache.get_or_build(key, [&] { return fake_built(key); });
    std::filesystem::resize_file(cache.cubin_path(key), 10);
    CHECK(cache.find(key) == nullptr);
  }
  // Each quarantine moved a cubin and a manifest and wrote a note; the second did not overwrite the first.
  CubinCache cache(options_for(dir.path()), {});
  CHECK(quarantined_files(cache, key).size() == 6);
}

TEST_CASE("verify finds every kind of problem, changes nothing, and is clean after rebuilding",
          "[cache][corruption][verify]") {
  TempDir dir;
  const std::vector<Damage> damages = all_damages();
  CubinCache cache(options_for(dir.path()), {});
  std::vector<std::string> keys;
  for (std::size_t i = 0; i <= damages.size(); ++i) {
    keys.push_back(key_for("entry " + std::to_string(i)));
    cache.get_or_build(keys.back(),
                       [&] { return fake_built(keys.back(), 1000 + i, "ptx " + std::to_string(i)); });
  }
  CHECK(cache.verify().clean());
  CHECK(cache.verify().checked == static_cast<int>(keys.size()));
  for (std::size_t i = 0; i < damages.size(); ++i) damages[i].apply(cache, keys[i]);
  // The last entry stays sound.

  const auto before = snapshot(dir.path());
  const cache::VerifyReport report = cache.verify();
  CHECK(snapshot(dir.path()) == before);
  CHECK(report.checked == static_cast<int>(keys.size()));
  REQUIRE(report.problems.size() == damages.size());
  for (std::size_t i = 0; i < damages.size(); ++i) {
    INFO(damages[i].name);
    const auto problem =
        std::find_if(report.problems.begin(), report.problems.end(),
                     [&](const std::string& line) { return line.starts_with(keys[i] + ": "); });
    REQUIRE(problem != report.problems.end());
    CHECK(contains(*problem, damages[i].reason));
  }

  WarningLog warnings;
  CubinCache repairing(options_for(dir.path()), warnings.sink());
  for (const std::string& key : keys)
    repairing.get_or_build(key, [&] { return fake_built(key, 1000, "ptx"); });
  CHECK(warnings.count() == damages.size());
  const cache::VerifyReport after = repairing.verify();
  INFO((after.problems.empty() ? std::string() : after.problems[0]));
  CHECK(after.clean());
  CHECK(after.checked == static_cast<int>(keys.size()));
}

TEST_CASE("verify reports PTX damage, stray PTX and an entry filed in the wrong shard", "[cache][verify]") {
  TempDir dir;
  CubinCache cache(options_for(dir.path()), {});
  const std::string with_ptx = key_for("with ptx");
  const std::string without_ptx = key_for("without ptx");
  const std::string misplaced = key_for("misplaced");
  cache.get_or_build(with_ptx, [&] { return fake_built(with_ptx, 100, "the ptx"); });
  cache.get_or_build(without_ptx, [&] { return fake_built(without_ptx, 100); });
  cache.get_or_build(misplaced, [&] { return fake_built(misplaced, 100); });

  core::write_file_atomic(cache.ptx_path(with_ptx), std::string_view("other ptx"));
  core::write_file_atomic(cache.ptx_path(without_ptx), std::string_view("stray"));
  const std::string other_shard = misplaced.substr(0, 2) == "00" ? "01" : "00";
  std::filesystem::create_directories(cache.entries_directory() / other_shard);
  for (const auto& path : {cache.cubin_path(misplaced), cache.manifest_path(misplaced)}) {
    std::filesystem::rename(path, cache.entries_directory() / other_shard / path.filename());
  }

  const cache::VerifyReport report = cache.verify();
  CHECK(report.checked == 3);
  REQUIRE(report.problems.size() == 3);
  const std::string all = [&] {
    std::string joined;
    for (const auto& line : report.problems) joined += line + "\n";
    return joined;
  }();
  INFO(all);
  CHECK(contains(all, with_ptx + ": ptx is 9 bytes but the manifest records 7"));
  CHECK(contains(all, without_ptx + ": a PTX file is present but the manifest records none"));
  CHECK(contains(all, misplaced + ": stored in"));
}
