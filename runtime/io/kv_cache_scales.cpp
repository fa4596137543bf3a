#include "io/kv_cache_scales.hpp"

#include <array>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "io/float16.hpp"
#include "io/load_problems.hpp"

namespace attnplan::io {
namespace {

// Names of the scales other tools write for fp8 attention itself (query, softmax probabilities): attnplan
// has no use for them, but they belong to the checkpoint's attention and are not a config mismatch.
constexpr std::array<std::string_view, 5> kIgnoredScales = {
    "self_attn.q_scale", "self_attn.attn.q_scale", "self_attn.q_proj.output_scale",
    "self_attn.prob_output_scale", "self_attn.attn.prob_scale"};

// One scale found in the file, already checked.
struct FoundScale {
  std::string name;
  float value = 0.0f;
};

// The scalar's value as f32, or a problem. F32 is exact; BF16 and F16 widen exactly.
std::optional<float> scalar_value(const SafetensorsFile& file, const std::string& name, char which,
                                  std::vector<std::string>& problems) {
  const TensorInfo& info = file.info(name);
  const bool scalar = info.shape.empty() || (info.shape.size() == 1 && info.shape[0] == 1);
  if (!scalar) {
    problems.push_back(
        fmt::format("{}: shape [{}], expected [] or [1]: one {} cache scale per layer (per-head "
                    "or per-channel cache scales are not supported)",
                    name, fmt::join(info.shape, ", "), which));
  }
  if (info.dtype != Dtype::f32 && info.dtype != Dtype::bf16 && info.dtype != Dtype::f16) {
    problems.push_back(fmt::format("{}: dtype {}, expected F32, BF16 or F16 (the {} cache scale)", name,
                                   to_string(info.dtype), which));
    return std::nullopt;
  }
  if (!scalar) return std::nullopt;
  const std::span<const std::uint8_t> bytes = file.bytes(name);
  float value = 0.0f;
  if (info.dtype == Dtype::f32) {
    std::memcpy(&value, bytes.data(), sizeof value);
  } else {
    std::uint16_t bits = 0;
    std::memcpy(&bits, bytes.data(), sizeof bits);
    value = info.dtype == Dtype::bf16 ? core::bf16_to_float(bits) : f16_to_float(bits);
  }
  if (!std::isfinite(value) || value <= 0.0f) {
    problems.push_back(
        fmt::format("{}: {} is not finite and > 0 (the fp8 {} cache is divided by it)", name, value, which));
    return std::nullopt;
  }
  return value;
}

// One of k or v: the checkpoint's scale if any (all names that hold one agreeing), else the config's.
std::optional<std::pair<float, std::string>> resolve_scale(const SafetensorsFile& file,
                                                           const std::optional<double>& configured,
                                                           const std::string& prefix, char which,
                                                           std::vector<std::string>& problems) {
  const std::size_t problems_before = problems.size();
  std::vector<FoundScale> found;
  std::vector<std::string> tried;
  for (const auto& relative : kv_scale_names(which)) {
    const std::string name = prefix + relative;
    tried.push_back(name);
    if (!file.contains(name)) continue;
    if (const auto value = scalar_value(file, name, which, problems)) found.push_back({name, *value});
  }
  for (std::size_t i = 1; i < found.size(); ++i) {
    if (found[i].value != found.front().value) {
      problems.push_back(fmt::format("{} = {} and {} = {} disagree (both name the {} cache scale)",
                                     found.front().name, found.front().value, found[i].name, found[i].value,
                                     which));
    }
  }
  const std::string field = fmt::format("/kv_cache/{}_scale", which);
  if (!found.empty() && configured && static_cast<float>(*configured) != found.front().value) {
    problems.push_back(
        fmt::format("{}: {} in the config disagrees with {} = {} in the checkpoint (compared as "
                    "f32; leave {} unset to take the checkpoint's)",
                    field, *configured, found.front().name, found.front().value, field));
  }
  if (found.empty() && !configured && problems.size() == problems_before) {
    problems.push_back(
        fmt::format("no {} cache scale: kv_cache.dtype is fp8_e4m3, {} is not set and the "
                    "checkpoint has none of {}",
                    which, field, fmt::join(tried, ", ")));
  }
  if (problems.size() != problems_before) return std::nullopt;
  if (!found.empty()) return std::pair{found.front().value, found.front().name};
  return std::pair{static_cast<float>(*configured), field};
}

}  // namespace

std::vector<std::string> kv_scale_names(char which) {
  return {fmt::format("self_attn.{}_scale", which), fmt::format("self_attn.attn.{}_scale", which),
          fmt::format("self_attn.{0}_proj.{0}_scale", which),
          fmt::format("self_attn.{}_proj.output_scale", which), "self_attn.kv_scale"};
}

bool is_kv_scale_name(std::string_view relative) {
  for (const char which : {'k', 'v'}) {
    for (const auto& name : kv_scale_names(which))
      if (relative == name) return true;
  }
  for (const auto name : kIgnoredScales)
    if (relative == name) return true;
  return false;
}

std::optional<KvCacheScales> read_kv_cache_scales(const SafetensorsFile& file,
                                                  const config::AttentionConfig& config,
                                                  const std::string& prefix,
                                                  std::vector<std::string>& problems) {
  if (config.kv_cache.dtype != config::KvCacheDtype::fp8_e4m3) return std::nullopt;
  const auto k = resolve_scale(file, config.kv_cache.k_scale, prefix, 'k', problems);
  const auto v = resolve_scale(file, config.kv_cache.v_scale, prefix, 'v', problems);
  if (!k || !v) return std::nullopt;
  return KvCacheScales{k->first, v->first, k->second, v->second};
}

std::optional<KvCacheScales> read_kv_cache_scales(const SafetensorsFile& file,
                                                  const config::AttentionConfig& config,
                                                  const std::string& prefix) {
  std::vector<std::string> problems;
  auto scales = read_kv_cache_scales(file, config, prefix, problems);
  throw_if_problems(std::move(problems), "with the fp8 KV cache scales", prefix, file);
  return scales;
}

}  // namespace attnplan::io
