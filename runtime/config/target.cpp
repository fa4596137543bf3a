#include "config/target.hpp"

#include <fmt/format.h>

#include "config/limits.hpp"

namespace attnplan::config {

std::string Arch::name() const {
  return fmt::format("sm_{}{}{}", major, minor, arch_specific ? "a" : "");
}

std::optional<Arch> parse_arch(std::string_view text) {
  constexpr std::string_view prefix = "sm_";
  if (!text.starts_with(prefix)) return std::nullopt;
  text.remove_prefix(prefix.size());
  const bool arch_specific = text.ends_with('a');
  if (arch_specific) text.remove_suffix(1);
  // sm_<major><minor>: the last digit is the minor version, so sm_100 is 10.0 and sm_121 is 12.1.
  if (text.size() < 2 || text.size() > 3 || text.front() == '0') return std::nullopt;
  int number = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    number = number * 10 + (c - '0');
  }
  return Arch{number / 10, number % 10, arch_specific};
}

std::optional<std::string> arch_problem(const Arch& arch) {
  if (arch.sm() < limits::kMinArchSm)
    return fmt::format("{} is not supported: the kernels need sm_80 or newer (cp.async, bf16 mma)",
                       arch.name());
  if (arch.arch_specific && arch.sm() < limits::kMinArchSpecificSm) {
    return fmt::format("{} does not exist: architecture-specific (\"a\") variants start at sm_90a",
                       arch.name());
  }
  return std::nullopt;
}

}  // namespace attnplan::config
