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

RuntimeOptions RuntimeOptions::from_environment() {
  RuntimeOptions options;
  options.cache_dir =
      cache::default_directory(variable("ATTNPLAN_CACHE_DIR"), variable("XDG_CACHE_HOME"), variable("HOME"));
  if (auto bytes = variable("ATTNPLAN_CACHE_MAX_BYTES")) {
    options.cache_max_bytes = static_cast<std::uint64_t>(parse_integer(*bytes, "ATTNPLAN_CACHE_MAX_BYTES"));
  }
  if (auto dir = variable("ATTNPLAN_TEMPLATE_DIR")) options.template_dir = std::filesystem::path(*dir);
  options.cuda_home = variable("CUDA_HOME");
  options.cuda_path = variable("CUDA_PATH");
  if (auto device = variable("ATTNPLAN_DEVICE")) {
    options.device = static_cast<int>(parse_integer(*device, "ATTNPLAN_DEVICE"));
  }
  return options;
}

}  // namespace attnplan
