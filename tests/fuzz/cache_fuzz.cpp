// libFuzzer harness for the cache's manifest reader and validator, driven through CubinCache (the
// manifest functions are internal to cache/): each input becomes one on-disk entry, then find(),
// verify(), list() and ptx() read it back.
//
// Input layout, so that one file can hold all three of an entry's files:
//   <manifest JSON> [ "\0CUBIN\0" <cubin bytes> [ "\0PTX\0" <ptx text> ] ]
// A missing part means that file is absent. The entry is filed under kKey, so a manifest must name it.
//
// Expected outcomes: an entry, nullptr (bad entries are quarantined, absent ones missed), a report, or
// Error. A crash, a sanitizer report or any other exception (e.g. nlohmann::json::type_error from a
// field read with the wrong type) is a bug.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "cache/cubin_cache.hpp"
#include "core/error.hpp"
#include "fuzz_support.hpp"

namespace {

// SHA-256 of "attnplan fuzz"; any valid key would do, the corpus entries are built for this one.
constexpr std::string_view kKey = "6222f2cc5a6aae81c86168165e8be9d53fc6489c2c4078c917396e683e63c002";
constexpr std::string_view kCubinMarker{"\0CUBIN\0", 7};
constexpr std::string_view kPtxMarker{"\0PTX\0", 5};

void write_part(const std::filesystem::path& path, std::string_view part) {
  attnplan::fuzz::write_bytes(path, reinterpret_cast<const std::uint8_t*>(part.data()), part.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnplan;
  static const fuzz::ScratchPath scratch("cache");
  const std::filesystem::path& root = scratch.get();
  const std::string key(kKey);
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  std::string_view manifest = input, cubin, ptx;
  bool has_cubin = false, has_ptx = false;
  if (const std::size_t at = input.find(kCubinMarker); at != std::string_view::npos) {
    manifest = input.substr(0, at);
    cubin = input.substr(at + kCubinMarker.size());
    has_cubin = true;
    if (const std::size_t ptx_at = cubin.find(kPtxMarker); ptx_at != std::string_view::npos) {
      ptx = cubin.substr(ptx_at + kPtxMarker.size());
      cubin = cubin.substr(0, ptx_at);
      has_ptx = true;
    }
  }

  // A fresh directory per input: the previous input's entry may have been quarantined or left behind.
  std::filesystem::remove_all(root);
  try {
    cache::CubinCache cache({.directory = root, .max_bytes = 0, .lock_timeout = {}},
                            [](const std::string&) {});
    const std::filesystem::path manifest_file = cache.manifest_path(key);
    std::filesystem::create_directories(manifest_file.parent_path());
    write_part(manifest_file, manifest);
    if (has_cubin) write_part(cache.cubin_path(key), cubin);
    if (has_ptx) write_part(cache.ptx_path(key), ptx);

    // Read-only passes first, while the entry is still in place; find() may then quarantine it.
    const cache::VerifyReport report = cache.verify();
    if (report.checked != 1) __builtin_trap();  // exactly one entry is on disk
    const auto listed = cache.list();
    if (listed.size() != 1 || listed.front().key != key) __builtin_trap();
    (void)cache.ptx(key);
    const auto entry = cache.find(key);
    // verify() checks all that find() does (and the PTX besides): a clean report means a usable entry.
    if (report.clean() && !entry) __builtin_trap();
    if (entry && entry->key != key) __builtin_trap();
  } catch (const Error&) {
    // refused: acceptable for any input
  }
  return 0;
}
