#include "runtime_setup.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace attnplan::cli {

std::optional<config::Arch> parse_arch_option(const std::string& text) {
  if (text == "auto") return std::nullopt;
  std::optional<config::Arch> arch = config::parse_arch(text);
  if (!arch) {
    throw Error(Stage::input,
                fmt::format("--arch {}: expected auto or a real arch such as sm_80, sm_89, sm_90a", text));
  }
  if (const std::optional<std::string> problem = config::arch_problem(*arch))
    throw Error(Stage::input, fmt::format("--arch {}: {}", text, *problem));
  return arch;
}

RuntimeOptions runtime_options_except_arch(const Arguments& args) {
  RuntimeOptions options = RuntimeOptions::from_environment();
  if (auto dir = args.value("--cache-dir")) options.cache_dir = *dir;
  if (auto path = args.value("--cache-path")) options.cache_path = parse_cache_path(*path);
  if (auto jit = args.value("--jit")) {
    const std::optional<JitPolicy> policy = parse_jit_policy(*jit);
    if (!policy)
      throw Error(Stage::input, fmt::format("--jit {}: expected on, off, read-only or rebuild", *jit));
    options.jit = *policy;
  }
  return options;
}

RuntimeOptions runtime_options(const Arguments& args) {
  RuntimeOptions options = runtime_options_except_arch(args);
  if (auto arch = args.value("--arch")) options.arch = parse_arch_option(*arch);
  return options;
}

}  // namespace attnplan::cli
