#include "plan/runtime_options.hpp"

#include <cstdlib>
#include <string>

#include "cache/cubin_cache.hpp"
#include "core/error.hpp"

namespace attnplan {

namespace {

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

long long parse_integer(const std::string& text, const char* name) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < 0) {
    throw Error(Stage::input, std::string(name) + "=" + text + ": expected a non-negative integer");
  }
  return value;
}

}  // namespace

std::optional<JitPolicy> parse_jit_policy(std::string_view text) {
  for (JitPolicy policy : {JitPolicy::on, JitPolicy::off, JitPolicy::read_only, JitPolicy::rebuild}) {
    if (text == to_string(policy)) return policy;
  }
  return std::nullopt;
}

std::string_view to_string(JitPolicy policy) {
  switch (policy) {
    case JitPolicy::on:
      return "on";
    case JitPolicy::off:
      return "off";
    case JitPolicy::read_only:
      return "read-only";
    case JitPolicy::rebuild:
      return "rebuild";
  }
  return "?";
}

std::vector<std::filesystem::path> parse_cache_path(std::string_view text) {
  std::vector<std::filesystem::path> directories;
  while (!text.empty()) {
    const std::size_t colon = text.find(':');
    const std::string_view part = text.substr(0, colon);
    if (!part.empty()) directories.emplace_back(part);
    if (colon == std::string_view::npos) break;
    text.remove_prefix(colon + 1);
  }
  return directories;
}

RuntimeOptions RuntimeOptions::from_environment() {
  RuntimeOptions options;
  options.cache_dir =
      cache::default_directory(variable("ATTNPLAN_CACHE_DIR"), variable("XDG_CACHE_HOME"), variable("HOME"));
  if (auto bytes = variable("ATTNPLAN_CACHE_MAX_BYTES")) {
    options.cache_max_bytes = static_cast<std::uint64_t>(parse_integer(*bytes, "ATTNPLAN_CACHE_MAX_BYTES"));
  }
  if (auto path = variable("ATTNPLAN_CACHE_PATH")) options.cache_path = parse_cache_path(*path);
  if (auto jit = variable("ATTNPLAN_JIT")) {
    const std::optional<JitPolicy> policy = parse_jit_policy(*jit);
    if (!policy)
      throw Error(Stage::input, "ATTNPLAN_JIT=" + *jit + ": expected on, off, read-only or rebuild");
    options.jit = *policy;
  }
  if (auto dir = variable("ATTNPLAN_TEMPLATE_DIR")) options.template_dir = std::filesystem::path(*dir);
  options.cuda_home = variable("CUDA_HOME");
  options.cuda_path = variable("CUDA_PATH");
  options.cuda_visible_devices = variable("CUDA_VISIBLE_DEVICES");
  if (auto device = variable("ATTNPLAN_DEVICE")) {
    options.device = static_cast<int>(parse_integer(*device, "ATTNPLAN_DEVICE"));
  }
  return options;
}

}  // namespace attnplan
