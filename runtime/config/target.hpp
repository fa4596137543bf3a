// The GPU architecture a plan is compiled for.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace attnplan::config {

// A real architecture, e.g. sm_90a = {9, 0, true}. "a" marks the architecture-specific variant that
// unlocks wgmma / setmaxnreg and runs only on that exact chip.
struct Arch {
  int major = 9;
  int minor = 0;
  bool arch_specific = true;

  int sm() const { return major * 10 + minor; }
  std::string name() const;  // "sm_90a"
  friend bool operator==(const Arch&, const Arch&) = default;
};

// Parses "sm_80", "sm_89", "sm_90a", "sm_100a", ... Returns nullopt for anything else.
std::optional<Arch> parse_arch(std::string_view text);

// Why the kernels cannot be built for `arch`, or nullopt when they can: before sm_80 (they need cp.async and
// the bf16 mma), and "a" variants before sm_90a (there are none). The one rule for target.arch, --arch,
// RuntimeOptions::arch and the arch "auto" resolves to; the caller names the field.
std::optional<std::string> arch_problem(const Arch& arch);

// The sm_90 default when "auto" must be resolved without a device (attnplan compile on a build host).
inline constexpr Arch kDefaultArch{9, 0, true};

struct Target {
  std::optional<Arch> arch;  // unset: "auto" (the device's arch, or kDefaultArch without a device)

  friend bool operator==(const Target&, const Target&) = default;
};

}  // namespace attnplan::config
