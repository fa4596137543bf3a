#include "runtime_setup.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace attnplan::cli {

RuntimeOptions runtime_options(const Arguments& args) {
  RuntimeOptions options = RuntimeOptions::from_environment();
  if (auto dir = args.value("--cache-dir")) options.cache_dir = *dir;
  if (auto arch = args.value("--arch"); arch && *arch != "auto") {
    options.arch = config::parse_arch(*arch);
    if (!options.arch) {
      throw Error(Stage::input,
                  fmt::format("--arch {}: expected auto or a real arch such as sm_80, sm_89, sm_90a", *arch));
    }
  }
  return options;
}

}  // namespace attnplan::cli
