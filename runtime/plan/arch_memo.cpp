#include "plan/arch_memo.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "core/files.hpp"
#include "core/sha256.hpp"

namespace attnplan::plan {

namespace {

std::filesystem::path memo_path(const std::filesystem::path& cache_dir) {
  return cache_dir / "devices.json";
}

nlohmann::json read_memo(const std::filesystem::path& cache_dir) {
  try {
    nlohmann::json memo = nlohmann::json::parse(core::read_text_file(memo_path(cache_dir)));
    if (memo.is_object()) return memo;
  } catch (...) {  // absent, unreadable or damaged: no memo
  }
  return nlohmann::json::object();
}

}  // namespace

std::optional<std::string> device_identity(const std::filesystem::path& proc_root, int ordinal,
                                           const std::optional<std::string>& visible_devices) {
  std::error_code error;
  const std::filesystem::path nvidia = proc_root / "driver" / "nvidia";
  if (!std::filesystem::exists(nvidia / "version", error)) return std::nullopt;
  std::string identity =
      "ordinal " + std::to_string(ordinal) + "\nvisible " + visible_devices.value_or("(all)");
  try {
    identity += "\n" + core::read_text_file(nvidia / "version");
    std::vector<std::filesystem::path> gpus;
    for (const auto& entry : std::filesystem::directory_iterator(nvidia / "gpus", error))
      gpus.push_back(entry.path());
    std::sort(gpus.begin(), gpus.end());
    for (const auto& gpu : gpus)
      identity += "\n" + gpu.filename().string() + "\n" + core::read_text_file(gpu / "information");
  } catch (...) {
    return std::nullopt;  // a half-readable /proc: do not trust a memo built on it
  }
  return core::sha256_hex(identity);
}

std::optional<config::Arch> remembered_arch(const std::filesystem::path& cache_dir,
                                            const std::string& identity) {
  const nlohmann::json memo = read_memo(cache_dir);
  const auto it = memo.find(identity);
  if (it == memo.end() || !it->is_string()) return std::nullopt;
  return config::parse_arch(it->get<std::string>());
}

void remember_arch(const std::filesystem::path& cache_dir, const std::string& identity,
                   const config::Arch& arch) {
  try {
    nlohmann::json memo = read_memo(cache_dir);
    memo[identity] = arch.name();
    std::filesystem::create_directories(cache_dir);
    core::write_file_atomic(memo_path(cache_dir), memo.dump(2) + "\n");
  } catch (...) {  // an unwritable cache forgets; the next compile asks the driver again
  }
}

}  // namespace attnplan::plan
