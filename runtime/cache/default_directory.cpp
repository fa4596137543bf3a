#include <filesystem>
#include <optional>
#include <string>

#include "cache/cubin_cache.hpp"

namespace attnplan::cache {

std::filesystem::path default_directory(const std::optional<std::string>& attnplan_cache_dir,
                                        const std::optional<std::string>& xdg_cache_home,
                                        const std::optional<std::string>& home) {
  // An exported-but-empty variable means "not set" to most shells' users, so it does not select "".
  if (attnplan_cache_dir && !attnplan_cache_dir->empty()) return *attnplan_cache_dir;
  if (xdg_cache_home && !xdg_cache_home->empty() && std::filesystem::path(*xdg_cache_home).is_absolute()) {
    return std::filesystem::path(*xdg_cache_home) / "attnplan";
  }
  if (home && !home->empty()) return std::filesystem::path(*home) / ".cache" / "attnplan";
  return {};
}

}  // namespace attnplan::cache
