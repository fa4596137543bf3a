#include "cache/layout.hpp"

#include <algorithm>
#include <map>
#include <system_error>

#include <fmt/format.h>

#include "cache/cubin_cache.hpp"
#include "core/error.hpp"

namespace attnplan::cache {
namespace {

bool is_lower_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

bool is_shard_name(const std::string& name) {
  return name.size() == 2 && is_lower_hex(name[0]) && is_lower_hex(name[1]);
}

// A key is printed in an error message; keep a hostile or huge one readable and on one line.
std::string printable(std::string_view text) {
  constexpr std::size_t kShown = 80;
  std::string out;
  for (char c : text.substr(0, kShown)) {
    if (c >= 0x20 && c < 0x7f) {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    }
  }
  if (text.size() > kShown) out += fmt::format("... ({} characters)", text.size());
  return out;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

std::optional<StoredFile> stat_file(const std::filesystem::directory_entry& item) {
  std::error_code error;
  if (!item.is_regular_file(error)) return std::nullopt;
  StoredFile file;
  file.path = item.path();
  file.bytes = item.file_size(error);
  if (error) return std::nullopt;  // vanished between listing and stat: a concurrent prune or quarantine
  file.mtime = item.last_write_time(error);
  if (error) return std::nullopt;
  return file;
}

}  // namespace

bool is_valid_key(std::string_view key) {
  return key.size() == 64 && std::all_of(key.begin(), key.end(), is_lower_hex);
}

void require_valid_key(std::string_view key) {
  if (!is_valid_key(key)) {
    throw Error(
        Stage::cache,
        fmt::format("invalid cache key '{}': expected 64 lowercase hex digits (a SHA-256)", printable(key)));
  }
}

std::filesystem::path entry_file(const std::filesystem::path& entries, std::string_view key,
                                 std::string_view extension) {
  std::string name(key);
  name += extension;
  return entries / std::string(key.substr(0, 2)) / name;
}

std::uint64_t StoredEntry::bytes() const {
  std::uint64_t total = 0;
  for (const auto* file : {&cubin, &manifest, &ptx}) {
    if (*file) total += (*file)->bytes;
  }
  return total;
}

std::filesystem::file_time_type StoredEntry::last_used() const {
  if (manifest) return manifest->mtime;
  if (cubin) return cubin->mtime;
  if (ptx) return ptx->mtime;
  return std::filesystem::file_time_type::min();
}

StoreScan scan_store(const std::filesystem::path& entries) {
  StoreScan scan;
  // Keyed by key and shard: a key's files found in the wrong shard form their own entry, so that
  // verify() can report them and prune() can remove exactly the files it saw.
  std::map<std::pair<std::string, std::filesystem::path>, StoredEntry> found;
  std::error_code error;
  for (std::filesystem::directory_iterator shards(entries, error), end; !error && shards != end;
       shards.increment(error)) {
    std::error_code type_error;
    if (!shards->is_directory(type_error) || !is_shard_name(shards->path().filename().string())) continue;
    std::error_code list_error;
    for (std::filesystem::directory_iterator files(shards->path(), list_error); !list_error && files != end;
         files.increment(list_error)) {
      const std::string name = files->path().filename().string();
      if (name.starts_with('.')) {
        if (ends_with(name, ".tmp")) {
          if (auto file = stat_file(*files)) scan.temp_files.push_back(*file);
        }
        continue;
      }
      const std::size_t dot = name.find('.');
      if (dot == std::string::npos) continue;
      const std::string key = name.substr(0, dot);
      const std::string_view extension = std::string_view(name).substr(dot);
      if (!is_valid_key(key)) continue;
      StoredEntry& entry = found[{key, shards->path()}];
      entry.key = key;
      entry.shard = shards->path();
      if (extension == kLockExtension) {
        entry.lock = files->path();
      } else if (extension == kCubinExtension) {
        entry.cubin = stat_file(*files);
      } else if (extension == kManifestExtension) {
        entry.manifest = stat_file(*files);
      } else if (extension == kPtxExtension) {
        entry.ptx = stat_file(*files);
      }
    }
  }
  for (auto& [id, entry] : found) scan.entries.push_back(std::move(entry));
  return scan;
}

}  // namespace attnplan::cache
