// Helpers shared by the kernel spec tests: a compiler over the source tree's templates, the archs the
// tests name, and fake device addresses for host-side checks.
#pragma once

#include <cstdint>
#include <string>

#include "compiler/compiler.hpp"
#include "config/target.hpp"

namespace attnplan::plan_testing {

inline constexpr config::Arch kSm80{8, 0, false};
inline constexpr config::Arch kSm86{8, 6, false};
inline constexpr config::Arch kSm89{8, 9, false};
inline constexpr config::Arch kSm90a{9, 0, true};
inline constexpr config::Arch kSm100a{10, 0, true};

// NVRTC over templates/ as checked out (so a template edit is tested without a rebuild of the embedding).
inline const compiler::Compiler& source_tree_compiler() {
  static const compiler::Compiler instance(
      compiler::Toolkit::locate({}, {}, {}),
      compiler::TemplateLibrary::from_directory(std::string(ATTNPLAN_SOURCE_DIR) + "/templates"));
  return instance;
}

// Device addresses are only checked for alignment, never dereferenced.
template <class T>
T* fake_pointer(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

}  // namespace attnplan::plan_testing
