// The rules of a valid AttentionConfig (docs/config.md lists each one). A rule names the JSON path
// of the field it is about, so a message points at the line to change.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "config/limits.hpp"
#include "config/parse.hpp"
#include "config/problems.hpp"
#include "core/error.hpp"

namespace attnplan::config {
namespace {

class Problems {
 public:
  template <typename... Args>
  void add(std::string_view path, fmt::format_string<Args...> rule, Args&&... args) {
    lines_.push_back(fmt::format("{}: {}", path, fmt::format(rule, std::forward<Args>(args)...)));
  }
  std::vector<std::string> take() { return std::move(lines_); }

 private:
  std::vector<std::string> lines_;
};

bool positive_finite(double value) {
  return std::isfinite(value) && value > 0.0;
}
bool is_power_of_two(int value) {
  return value > 0 && (value & (value - 1)) == 0;
}

// hidden_size, head_dim and value_head_dim are row lengths the kernels move in 16-byte vectors.
void check_row_length(Problems& problems, std::string_view path, int value, int min, int max) {
  if (value < min || value > max) {
    problems.add(path, "{} is outside the supported range {}..{}", value, min, max);
  } else if (value % limits::kVectorElements != 0) {
    problems.add(path, "{} is not a multiple of {} (kernels move rows in 16-byte vectors of {} bf16)", value,
                 limits::kVectorElements, limits::kVectorElements);
  }
}

void check_shape(const AttentionConfig& config, Problems& problems) {
  check_row_length(problems, "/hidden_size", config.hidden_size, limits::kVectorElements,
                   limits::kMaxHiddenSize);

  const int query_heads = config.query_heads;
  if (query_heads < 1 || query_heads > limits::kMaxQueryHeads) {
    problems.add("/query_heads", "{} is outside the supported range 1..{}", query_heads,
                 limits::kMaxQueryHeads);
  }
  if (config.kv_heads < 1) {
    problems.add("/kv_heads", "must be positive, got {}", config.kv_heads);
  } else if (query_heads >= 1 && query_heads % config.kv_heads != 0) {
    problems.add("/kv_heads", "{} does not divide query_heads {}", config.kv_heads, query_heads);
  }

  if (config.head_dim == 0 && query_heads >= 1 && config.hidden_size % query_heads != 0) {
    problems.add("/head_dim", "no default: hidden_size {} is not a multiple of query_heads {}; set head_dim",
                 config.hidden_size, query_heads);
  } else {
    check_row_length(problems, "/head_dim", config.head_dim, limits::kMinHeadDim, limits::kMaxHeadDim);
  }
  // The same rule holds for both; a value_head_dim equal to head_dim (its default) is reported there, once.
  if (config.value_head_dim != config.head_dim) {
    check_row_length(problems, "/value_head_dim", config.value_head_dim, limits::kMinHeadDim,
                     limits::kMaxHeadDim);
  }
}

void check_norm(Problems& problems, std::string_view path, std::optional<double> epsilon,
                double weight_offset) {
  if (epsilon && !positive_finite(*epsilon)) {
    problems.add(fmt::format("{}/epsilon", path), "must be positive, got {}", *epsilon);
  }
  if (weight_offset != 0.0 && weight_offset != 1.0) {
    problems.add(fmt::format("{}/weight_offset", path), "must be 0 or 1, got {}", weight_offset);
  }
}

void check_scaling(const RopeScaling& scaling, Problems& problems) {
  const auto positive = [&](std::string_view key, double value) {
    if (!positive_finite(value)) {
      problems.add(fmt::format("/rotary/scaling/{}", key), "must be positive for {} scaling, got {}",
                   to_string(scaling.type), value);
    }
  };
  const auto original_max_position = [&] {
    if (scaling.original_max_position <= 0) {
      problems.add("/rotary/scaling/original_max_position", "must be positive for {} scaling, got {}",
                   to_string(scaling.type), scaling.original_max_position);
    }
  };
  switch (scaling.type) {
    case RopeScalingType::none:
      break;
    case RopeScalingType::linear:
      positive("factor", scaling.factor);
      break;
    case RopeScalingType::llama3:
      positive("factor", scaling.factor);
      positive("low_freq_factor", scaling.low_freq_factor);
      if (!(scaling.high_freq_factor > scaling.low_freq_factor) || !std::isfinite(scaling.high_freq_factor)) {
        problems.add("/rotary/scaling/high_freq_factor", "{} must be greater than low_freq_factor {}",
                     scaling.high_freq_factor, scaling.low_freq_factor);
      }
      original_max_position();
      break;
    case RopeScalingType::yarn:
      positive("factor", scaling.factor);
      original_max_position();
      positive("beta_slow", scaling.beta_slow);
      // The ramp runs from d(beta_fast) up to d(beta_slow), and d falls as beta grows.
      if (!(scaling.beta_fast > scaling.beta_slow) || !std::isfinite(scaling.beta_fast)) {
        problems.add("/rotary/scaling/beta_fast", "{} must be greater than beta_slow {}", scaling.beta_fast,
                     scaling.beta_slow);
      }
      if (scaling.attention_factor) positive("attention_factor", *scaling.attention_factor);
      break;
  }
}

void check_rotary(const AttentionConfig& config, Problems& problems) {
  const Rotary& rotary = config.rotary;
  // theta^(-2i/R) must fall with i, and yarn divides by ln(theta).
  if (!(std::isfinite(rotary.theta) && rotary.theta > 1.0)) {
    problems.add("/rotary/theta", "must be greater than 1, got {}", rotary.theta);
  }
  check_scaling(rotary.scaling, problems);

  const int head_dim = config.head_dim;
  if (head_dim <= 0) return;  // reported at /head_dim; every rule below is relative to it
  const int offset = rotary.offset;
  if (offset < 0 || offset > head_dim) {
    problems.add("/rotary/offset", "{} is outside 0..head_dim {}", offset, head_dim);
    return;
  }
  const int dim = config.rotary_dim();
  if (dim < 0) {
    problems.add("/rotary/dim", "must be >= 0 (0 disables RoPE), got {}", dim);
    return;
  }
  if (dim % 2 != 0) {
    problems.add("/rotary/dim", "{} is odd; RoPE rotates pairs of dimensions", dim);
    return;  // the pairing rules below assume whole pairs
  }
  if (offset + dim > head_dim) {
    problems.add("/rotary/dim", "offset {} + dim {} = {} exceeds head_dim {}", offset, dim, offset + dim,
                 head_dim);
    return;
  }
  if (dim == 0) return;  // RoPE disabled: no pairs

  const int pairing_dim = config.pairing_dim();
  if (pairing_dim < 2 || pairing_dim % 2 != 0) {
    problems.add("/rotary/pairing_dim", "must be even and >= 2, got {}", pairing_dim);
  } else if (pairing_dim <= dim && dim % pairing_dim != 0) {
    problems.add("/rotary/pairing_dim", "{} does not divide rotary dim {}", pairing_dim, dim);
  } else {
    // Pair i rotates dimensions a = offset + pairing_dim * (i / half) + i % half and b = a + half, both
    // increasing with i, so the last pair holds the highest index. With pairing_dim > dim the partners
    // sit half a pairing block away and can fall past the head even though offset + dim fits.
    const int half = pairing_dim / 2;
    const int last = dim / 2 - 1;
    const std::int64_t highest =
        std::int64_t{offset} + std::int64_t{pairing_dim} * (last / half) + last % half + half;
    if (highest >= head_dim) {
      problems.add("/rotary/pairing_dim",
                   "{} pairs dimension {} with {}, past head_dim {} (offset {}, dim {})", pairing_dim,
                   highest - half, highest, head_dim, offset, dim);
    }
  }
}

void check_attention(const AttentionConfig& config, Problems& problems) {
  if (config.attention_scale && !positive_finite(*config.attention_scale)) {
    problems.add("/attention_scale", "must be positive, got {}", *config.attention_scale);
  }
  if (config.softcap && !positive_finite(*config.softcap)) {
    problems.add("/softcap", "must be positive (omit it for no soft-capping), got {}", *config.softcap);
  }
  if (config.sliding_window && *config.sliding_window < 1) {
    problems.add("/sliding_window", "must be >= 1 (omit it for full causal attention), got {}",
                 *config.sliding_window);
  }
}

// The input dimension K of one projection: the length of the rows its scales and groups run along.
struct ReductionDim {
  std::string description;  // "hidden_size 4096"
  std::int64_t size;
};

// `inherited`: the output encoding is a copy of the qkv one. The rules that do not depend on K were
// reported at /projection already; only the K-dependent ones are checked again, against o_proj's K.
void check_encoding(const WeightEncoding& encoding, std::string_view path, const ReductionDim& k,
                    const std::optional<Arch>& arch, bool inherited, Problems& problems) {
  const auto at = [&](std::string_view key) { return fmt::format("{}/{}", path, key); };
  const std::string_view origin =
      inherited ? " (o_proj takes the qkv encoding unless /projection/output is set)" : "";
  const auto block_scaled = [&](int block) {
    if (k.size % block != 0) {
      problems.add(at("format"), "{} scales blocks of {} weights along K, and {} is not a multiple of {}{}",
                   to_string(encoding.format), block, k.description, block, origin);
    }
  };
  const auto group_divides = [&] {
    if (encoding.group_size > 0 && k.size % encoding.group_size != 0) {
      problems.add(at("group_size"), "{} does not divide {}{}", encoding.group_size, k.description, origin);
    }
  };

  switch (encoding.format) {
    case WeightFormat::bf16:
      break;
    case WeightFormat::fp8:
      if (!inherited && encoding.activation == ActivationType::fp8 && arch &&
          arch->sm() < limits::kMinFp8ActivationSm) {
        problems.add(at("activation"),
                     "fp8 activations need fp8 tensor cores (sm_89 or newer); target arch is {}",
                     arch->name());
      }
      break;
    case WeightFormat::mxfp8:
    case WeightFormat::mxfp4:
      block_scaled(32);
      break;
    case WeightFormat::nvfp4:
      block_scaled(16);
      break;
    case WeightFormat::packed_integer:
      if (!inherited) {
        if (encoding.bits != 4 && encoding.bits != 8) {
          problems.add(at("bits"), "{} is not a packed_integer width (4 or 8)", encoding.bits);
        } else if (encoding.scheme == PackedIntegerScheme::awq && encoding.bits != 4) {
          problems.add(at("bits"), "awq packs 4-bit values only, got {}", encoding.bits);
        }
        if (encoding.group_size != -1 && encoding.group_size < 1) {
          problems.add(at("group_size"), "must be -1 (per channel) or positive, got {}", encoding.group_size);
        }
        if (encoding.act_order && encoding.scheme == PackedIntegerScheme::awq) {
          problems.add(at("act_order"), "awq has no act order (g_idx); only gptq and gptq_v2 do");
        }
      }
      group_divides();
      break;
    case WeightFormat::affine: {
      const bool known_bits = encoding.bits >= 2 && encoding.bits <= 8 && encoding.bits != 7;
      const bool known_group =
          encoding.group_size == 32 || encoding.group_size == 64 || encoding.group_size == 128;
      if (!inherited && !known_bits) {
        problems.add(at("bits"), "{} is not an affine width (2, 3, 4, 5, 6 or 8)", encoding.bits);
      }
      if (!inherited && !known_group) {
        problems.add(at("group_size"), "{} is not an affine group size (32, 64 or 128)", encoding.group_size);
      }
      if (known_group) group_divides();
      break;
    }
  }
}

void check_projection(const AttentionConfig& config, Problems& problems) {
  const Projection& projection = config.projection;
  const std::optional<Arch>& arch = config.target.arch;
  check_encoding(projection.qkv, "/projection",
                 {fmt::format("hidden_size {}", config.hidden_size), config.hidden_size}, arch, false,
                 problems);
  const std::int64_t attention_width = std::int64_t{config.query_heads} * config.value_head_dim;
  const bool inherited = projection.output == projection.qkv;
  // A copied encoding over the same K would repeat /projection's findings word for word.
  if (inherited && attention_width == config.hidden_size) return;
  check_encoding(projection.output, "/projection/output",
                 {fmt::format("query_heads * value_head_dim = {}", attention_width), attention_width}, arch,
                 inherited, problems);
}

void check_runtime(const AttentionConfig& config, Problems& problems) {
  const int block_size = config.kv_cache.block_size;
  if (!is_power_of_two(block_size) || block_size > limits::kMaxBlockSize) {
    problems.add("/kv_cache/block_size", "{} is not a power of two in 1..{}", block_size,
                 limits::kMaxBlockSize);
  }
  for (const auto& [field, given] :
       {std::pair{"k_scale", config.kv_cache.k_scale}, std::pair{"v_scale", config.kv_cache.v_scale}}) {
    if (!given) continue;  // not given: a checkpoint's scale, or 1 without one
    const double scale = *given;
    if (!std::isfinite(scale) || scale <= 0.0) {
      problems.add(fmt::format("/kv_cache/{}", field), "{} must be finite and > 0", scale);
    } else if (scale != 1.0 && config.kv_cache.dtype != KvCacheDtype::fp8_e4m3) {
      problems.add(fmt::format("/kv_cache/{}", field),
                   "{} is only meaningful with dtype fp8_e4m3 (dtype is {})", scale,
                   to_string(config.kv_cache.dtype));
    }
  }
  if (config.max_tokens < 1 || config.max_tokens > limits::kMaxTokens) {
    problems.add("/max_tokens", "{} is outside 1..{}", config.max_tokens, limits::kMaxTokens);
  }
  if (const std::optional<Arch>& arch = config.target.arch) {
    if (const std::optional<std::string> problem = arch_problem(*arch))
      problems.add("/target/arch", "{}", *problem);
  }
}

}  // namespace

std::vector<std::string> validate(const AttentionConfig& config) {
  Problems problems;
  check_shape(config, problems);
  check_norm(problems, "/input_norm", config.input_norm.epsilon, config.input_norm.weight_offset);
  // An epsilon copied from input_norm is reported there, once.
  std::optional<double> qkv_epsilon = config.qkv_norm.epsilon;
  if (qkv_epsilon == config.input_norm.epsilon) qkv_epsilon.reset();
  check_norm(problems, "/qkv_norm", qkv_epsilon, config.qkv_norm.weight_offset);
  check_rotary(config, problems);
  check_attention(config, problems);
  check_projection(config, problems);
  check_runtime(config, problems);
  return problems.take();
}

void check(const AttentionConfig& config, std::string_view source_name) {
  std::vector<std::string> problems = validate(config);
  if (!problems.empty()) detail::throw_problems(std::move(problems), source_name);
}

namespace detail {

void throw_problems(std::vector<std::string> problems, std::string_view source_name) {
  const std::size_t count = problems.size();
  throw Error(Stage::config, fmt::format("{} problem{} in {}", count, count == 1 ? "" : "s", source_name), {},
              std::move(problems));
}

std::string pointer_token(std::string_view key) {
  std::string token;
  for (const char c : key) {
    if (c == '~') {
      token += "~0";
    } else if (c == '/') {
      token += "~1";
    } else {
      token += c;
    }
  }
  return token;
}

std::string describe(const nlohmann::json& value) {
  if (!value.is_primitive() || value.is_null()) return value.type_name();
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return fmt::format("{} {}", value.type_name(), text);
}

}  // namespace detail

}  // namespace attnplan::config
