// How the subcommands turn their common options (--cache-dir, --arch) into RuntimeOptions.
#pragma once

#include "cli.hpp"
#include "plan/runtime_options.hpp"

namespace attnplan::cli {

// RuntimeOptions from the environment, then --cache-dir and --arch when the command has them.
RuntimeOptions runtime_options(const Arguments& args);

inline const OptionSpec kCacheDirOption{
    "--cache-dir", "DIR", "cache directory (default: $ATTNPLAN_CACHE_DIR, else ~/.cache/attnplan)"};

}  // namespace attnplan::cli
