// How the subcommands turn their common options (--cache-dir, --cache-path, --jit, --arch) into
// RuntimeOptions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "config/target.hpp"
#include "plan/runtime_options.hpp"

namespace attnplan::cli {

// RuntimeOptions from the environment, then --cache-dir, --cache-path, --jit and --arch when the command
// has them (an option a command does not declare is simply absent).
RuntimeOptions runtime_options(const Arguments& args);
// The same without --arch, for a command that takes several archs (compile --arch sm_80,sm_90a).
RuntimeOptions runtime_options_except_arch(const Arguments& args);

// One --arch value: nullopt for "auto", else the arch; Error(input) naming the value otherwise.
std::optional<config::Arch> parse_arch_option(const std::string& text);

inline const OptionSpec kCacheDirOption{
    "--cache-dir", "DIR", "cache directory (default: $ATTNPLAN_CACHE_DIR, else ~/.cache/attnplan)"};
inline const OptionSpec kCachePathOption{
    "--cache-path", "DIRS",
    "read-only cache directories searched first, ':'-separated ($ATTNPLAN_CACHE_PATH)"};
inline const OptionSpec kJitOption{"--jit", "POLICY",
                                   "on (default), off (fail unless cached), read-only (write no cache), "
                                   "rebuild ($ATTNPLAN_JIT)"};

}  // namespace attnplan::cli
