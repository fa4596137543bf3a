#include "io/layer_weights.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "io/checked_math.hpp"
#include "io/float16.hpp"
#include "io/kv_cache_scales.hpp"
#include "io/load_problems.hpp"
#include "io/projection_format.hpp"

namespace attnplan::io {
namespace {

// Elements are read with memcpy straight from the file's little-endian bytes.
static_assert(std::endian::native == std::endian::little, "attnplan::io assumes a little-endian host");

// The names the attention owns under a layer prefix; see the top of the header.
constexpr std::string_view kAttentionNamespace = "self_attn.";
constexpr std::string_view kInputNormNamespace = "input_layernorm.";
constexpr std::string_view kDerivedBuffers = "self_attn.rotary_emb.";

// One tensor the config asks for, with the words that explain it in a message.
struct Expected {
  std::string relative;                           // name under the prefix
  std::vector<std::vector<std::int64_t>> shapes;  // accepted; the first is the one messages name
  std::string formula;        // the shape in config terms: "[query_heads * head_dim, hidden_size]"
  std::vector<Dtype> dtypes;  // accepted
  std::string reason;         // why the config needs it; empty for tensors every layer has
  bool optional = false;      // read when present, not missing when absent (GPTQ g_idx without act_order)
};

const std::vector<Dtype> kSmallFloat = {Dtype::bf16, Dtype::f16, Dtype::f32};

std::string shape_text(std::span<const std::int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// "BF16", "BF16 or F32", "BF16, F16 or F32".
std::string allowed_text(const std::vector<Dtype>& dtypes) {
  std::string text;
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    if (i != 0) text += i + 1 == dtypes.size() ? " or " : ", ";
    text += to_string(dtypes[i]);
  }
  return text;
}

bool is_digit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

// Orders "model.layers.2." before "model.layers.10.": digit runs compare as numbers.
bool natural_less(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      std::size_t i_end = i, j_end = j;
      while (i_end < a.size() && is_digit(a[i_end])) ++i_end;
      while (j_end < b.size() && is_digit(b[j_end])) ++j_end;
      std::string_view digits_a = a.substr(i, i_end - i), digits_b = b.substr(j, j_end - j);
      while (digits_a.size() > 1 && digits_a.front() == '0') digits_a.remove_prefix(1);
      while (digits_b.size() > 1 && digits_b.front() == '0') digits_b.remove_prefix(1);
      if (digits_a.size() != digits_b.size()) return digits_a.size() < digits_b.size();
      if (digits_a != digits_b) return digits_a < digits_b;
      i = i_end;
      j = j_end;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// A few prefixes in full, many as a range: "model.layers.0." .. "model.layers.31." (32 prefixes).
std::string describe_prefixes(const std::set<std::string>& prefixes) {
  std::vector<std::string> sorted(prefixes.begin(), prefixes.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const std::string& a, const std::string& b) { return natural_less(a, b); });
  std::vector<std::string> quoted;
  for (const auto& prefix : sorted) quoted.push_back(fmt::format("\"{}\"", prefix));
  if (quoted.size() <= 4) return fmt::format("{}", fmt::join(quoted, ", "));
  return fmt::format("{} .. {} ({} prefixes)", quoted.front(), quoted.back(), quoted.size());
}

// The prefixes under which the file holds `relative` (any of `relatives`), other than `except`.
std::set<std::string> prefixes_holding(const SafetensorsFile& file, std::span<const std::string> relatives,
                                       const std::string& except) {
  std::set<std::string> prefixes;
  for (const auto& name : file.names()) {
    for (const auto& relative : relatives) {
      if (!name.ends_with(relative)) continue;
      std::string prefix = name.substr(0, name.size() - relative.size());
      if (prefix != except) prefixes.insert(std::move(prefix));
    }
  }
  return prefixes;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Names of the file within a few edits of `name` (a typo, "layer." for "layers."), closest first. Names
// the config reads are not suggestions: k_proj is one edit from q_proj, but it is not a misspelling of it.
std::vector<std::string> close_names(const SafetensorsFile& file, std::string_view name,
                                     const std::set<std::string, std::less<>>& expected_names) {
  constexpr std::size_t kMaxEdits = 3;
  std::vector<std::pair<std::size_t, std::string>> scored;
  for (const auto& candidate : file.names()) {
    if (expected_names.count(candidate) != 0) continue;
    const std::size_t length_gap =
        candidate.size() > name.size() ? candidate.size() - name.size() : name.size() - candidate.size();
    if (length_gap > kMaxEdits) continue;
    const std::size_t distance = edit_distance(candidate, name);
    if (distance <= kMaxEdits) scored.emplace_back(distance, candidate);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> names;
  for (std::size_t i = 0; i < scored.size() && i < 3; ++i)
    names.push_back(fmt::format("\"{}\"", scored[i].second));
  return names;
}

// What the file has instead of a missing tensor, most specific first; empty when nothing looks related.
std::string missing_hint(const SafetensorsFile& file, const std::string& prefix, const std::string& relative,
                         const std::set<std::string, std::less<>>& expected_names) {
  static const std::set<std::string, std::less<>> kSeparate = {
      "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"};
  if (kSeparate.count(relative) != 0 && file.contains(prefix + "self_attn.qkv_proj.weight")) {
    return "; the file has a fused self_attn.qkv_proj.weight instead (set projection.fused_qkv)";
  }
  if (relative == "self_attn.qkv_proj.weight" && file.contains(prefix + "self_attn.q_proj.weight")) {
    return "; the file has separate q/k/v_proj weights instead (projection.fused_qkv is true)";
  }
  const std::string relatives[] = {relative};
  if (const auto prefixes = prefixes_holding(file, relatives, prefix); !prefixes.empty()) {
    return fmt::format("; the file has it under {}", describe_prefixes(prefixes));
  }
  if (const auto names = close_names(file, prefix + relative, expected_names); !names.empty()) {
    return fmt::format("; similar names in the file: {}", fmt::join(names, ", "));
  }
  return {};
}

// A quantized projection's calibrated static activation scale (`*_proj.input_scale`: ModelOpt FP8 /
// NVFP4, llm-compressor static schemes). attnplan runs such weights weight-only or quantizes activations
// per token at run time, so the scale is part of the checkpoint but not read. Under a bf16 projection the
// tensor is a config mismatch and stays an error.
bool is_unread_activation_scale(std::string_view relative, const config::AttentionConfig& config) {
  const auto quantized = [](const config::WeightEncoding& e) {
    return e.format != config::WeightFormat::bf16;
  };
  for (const std::string_view name : {"self_attn.q_proj.input_scale", "self_attn.k_proj.input_scale",
                                      "self_attn.v_proj.input_scale", "self_attn.qkv_proj.input_scale"}) {
    if (relative == name) return quantized(config.projection.qkv);
  }
  return relative == "self_attn.o_proj.input_scale" && quantized(config.projection.output);
}

// Why a tensor the file has under the attention's names is not one this config reads.
std::string unused_reason(std::string_view relative, const config::AttentionConfig& config) {
  const bool fused = config.projection.fused_qkv;
  if (relative == "self_attn.q_norm.weight") return "qkv_norm.query is false";
  if (relative == "self_attn.k_norm.weight") return "qkv_norm.key is false";
  if (relative == "self_attn.v_norm.weight") return "the value norm (qkv_norm.value) has no weight";
  if (relative == "self_attn.o_proj.bias") return "output_bias is false";
  if (relative.ends_with("_proj.input_scale")) return "a static activation scale of a bf16 projection";
  if (relative == "self_attn.sinks") return "sinks is false";
  if (relative == "self_attn.qkv_proj.weight") return "projection.fused_qkv is false";
  if (relative == "self_attn.q_proj.weight" || relative == "self_attn.k_proj.weight" ||
      relative == "self_attn.v_proj.weight") {
    return "projection.fused_qkv is true, the fused self_attn.qkv_proj.weight is read";
  }
  if (relative == "self_attn.qkv_proj.bias" || relative == "self_attn.q_proj.bias" ||
      relative == "self_attn.k_proj.bias" || relative == "self_attn.v_proj.bias") {
    if (!config.qkv_bias) return "qkv_bias is false";
    return fused ? "the fused self_attn.qkv_proj.bias is read" : "projection.fused_qkv is false";
  }
  return "not a tensor of this attention config";
}

// The tensors of one projection (io/projection_format.hpp) as Expected entries. bf16 keeps the shape
// formula in config terms; the other formats name N and K once.
void add_projection(std::vector<Expected>& expected, const config::WeightEncoding& encoding,
                    const std::string& base, std::int64_t n, std::int64_t k, const std::string& n_text,
                    const std::string& k_text, const std::string& reason, bool gpt_oss_names) {
  const std::string_view format = config::to_string(encoding.format);
  for (auto& rule : projection_tensor_rules(encoding, base, n, k, gpt_oss_names)) {
    std::string formula = encoding.format == config::WeightFormat::bf16
                              ? fmt::format("[{}, {}]", n_text, k_text)
                              : fmt::format("{} with N = {}, K = {}", rule.formula, n_text, k_text);
    std::string why = reason;
    if (encoding.format != config::WeightFormat::bf16) {
      why = fmt::format("{}projection format is {}", reason.empty() ? "" : reason + " and ", format);
    }
    expected.push_back({std::move(rule.relative), std::move(rule.shapes), std::move(formula),
                        std::move(rule.dtypes), std::move(why), rule.optional});
  }
}

// mxfp4 checkpoints from gpt-oss name the projection's bytes base_blocks / base_scales.
bool uses_gpt_oss_names(const SafetensorsFile& file, const config::WeightEncoding& encoding,
                        const std::string& prefix, const std::string& base) {
  return encoding.format == config::WeightFormat::mxfp4 && file.contains(prefix + base + "_blocks") &&
         !file.contains(prefix + base + ".weight");
}

std::vector<Expected> expected_tensors(const SafetensorsFile& file, const config::AttentionConfig& config,
                                       const std::string& prefix, bool fused_bias_in_file) {
  const std::int64_t hidden = config.hidden_size;
  const std::int64_t q_rows = std::int64_t{config.query_heads} * config.head_dim;
  const std::int64_t k_rows = std::int64_t{config.kv_heads} * config.head_dim;
  const std::int64_t v_rows = std::int64_t{config.kv_heads} * config.value_head_dim;
  const std::string qkv_rows = "query_heads * head_dim + kv_heads * head_dim + kv_heads * value_head_dim";
  const auto& qkv = config.projection.qkv;
  const auto gpt_oss = [&](const std::string& base, const config::WeightEncoding& encoding) {
    return uses_gpt_oss_names(file, encoding, prefix, base);
  };

  std::vector<Expected> expected;
  expected.push_back({"input_layernorm.weight", {{hidden}}, "[hidden_size]", kSmallFloat, "", false});
  if (config.projection.fused_qkv) {
    add_projection(expected, qkv, "self_attn.qkv_proj", q_rows + k_rows + v_rows, hidden, qkv_rows,
                   "hidden_size", "projection.fused_qkv is true", false);
  } else {
    add_projection(expected, qkv, "self_attn.q_proj", q_rows, hidden, "query_heads * head_dim", "hidden_size",
                   "", gpt_oss("self_attn.q_proj", qkv));
    add_projection(expected, qkv, "self_attn.k_proj", k_rows, hidden, "kv_heads * head_dim", "hidden_size",
                   "", gpt_oss("self_attn.k_proj", qkv));
    add_projection(expected, qkv, "self_attn.v_proj", v_rows, hidden, "kv_heads * value_head_dim",
                   "hidden_size", "", gpt_oss("self_attn.v_proj", qkv));
  }
  if (config.qkv_bias) {
    if (config.projection.fused_qkv && fused_bias_in_file) {
      expected.push_back({"self_attn.qkv_proj.bias",
                          {{q_rows + k_rows + v_rows}},
                          fmt::format("[{}]", qkv_rows),
                          kSmallFloat,
                          "qkv_bias is true",
                          false});
    } else {
      const std::string reason = config.projection.fused_qkv
                                     ? "qkv_bias is true and there is no fused self_attn.qkv_proj.bias"
                                     : "qkv_bias is true";
      expected.push_back(
          {"self_attn.q_proj.bias", {{q_rows}}, "[query_heads * head_dim]", kSmallFloat, reason});
      expected.push_back({"self_attn.k_proj.bias", {{k_rows}}, "[kv_heads * head_dim]", kSmallFloat, reason});
      expected.push_back(
          {"self_attn.v_proj.bias", {{v_rows}}, "[kv_heads * value_head_dim]", kSmallFloat, reason});
    }
  }
  if (config.qkv_norm.query) {
    expected.push_back({"self_attn.q_norm.weight",
                        {{config.head_dim}},
                        "[head_dim]",
                        kSmallFloat,
                        "qkv_norm.query is true"});
  }
  if (config.qkv_norm.key) {
    expected.push_back(
        {"self_attn.k_norm.weight", {{config.head_dim}}, "[head_dim]", kSmallFloat, "qkv_norm.key is true"});
  }
  add_projection(expected, config.projection.output, "self_attn.o_proj", hidden,
                 std::int64_t{config.query_heads} * config.value_head_dim, "hidden_size",
                 "query_heads * value_head_dim", "", gpt_oss("self_attn.o_proj", config.projection.output));
  if (config.output_bias) {
    expected.push_back(
        {"self_attn.o_proj.bias", {{hidden}}, "[hidden_size]", kSmallFloat, "output_bias is true"});
  }
  if (config.sinks) {
    expected.push_back(
        {"self_attn.sinks", {{config.query_heads}}, "[query_heads]", kSmallFloat, "sinks is true"});
  }
  return expected;
}

std::vector<std::string> check_layer(const SafetensorsFile& file, const config::AttentionConfig& config,
                                     const std::string& prefix, const std::vector<Expected>& expected) {
  std::vector<std::string> problems;

  const std::string attention_prefix = prefix + std::string(kAttentionNamespace);
  const std::string input_norm_prefix = prefix + std::string(kInputNormNamespace);
  const bool anything_under_prefix =
      std::any_of(file.names().begin(), file.names().end(), [&](const auto& name) {
        return name.starts_with(attention_prefix) || name.starts_with(input_norm_prefix);
      });
  if (!anything_under_prefix) {
    std::vector<std::string> relatives;
    for (const auto& tensor : expected) relatives.push_back(tensor.relative);
    const auto prefixes = prefixes_holding(file, relatives, prefix);
    problems.push_back(
        prefixes.empty()
            ? fmt::format("no attention weights under the prefix \"{}\", nor under any other ({} tensors in "
                          "the file)",
                          prefix, file.names().size())
            : fmt::format("no attention weights under the prefix \"{}\"; the file has layers under {}",
                          prefix, describe_prefixes(prefixes)));
  }

  std::set<std::string, std::less<>> expected_names;
  for (const auto& tensor : expected) expected_names.insert(prefix + tensor.relative);
  for (const auto& tensor : expected) {
    const std::string name = prefix + tensor.relative;
    const std::string reason = tensor.reason.empty() ? "" : fmt::format(", because {}", tensor.reason);
    if (!file.contains(name)) {
      if (tensor.optional) continue;
      problems.push_back(fmt::format("{}: missing (expected {} {} = {}{}){}", name,
                                     allowed_text(tensor.dtypes), shape_text(tensor.shapes.front()),
                                     tensor.formula, reason,
                                     missing_hint(file, prefix, tensor.relative, expected_names)));
      continue;
    }
    const TensorInfo& info = file.info(name);
    if (std::find(tensor.dtypes.begin(), tensor.dtypes.end(), info.dtype) == tensor.dtypes.end()) {
      problems.push_back(
          fmt::format("{}: dtype {}, expected {}", name, to_string(info.dtype), allowed_text(tensor.dtypes)));
    }
    if (std::find(tensor.shapes.begin(), tensor.shapes.end(), info.shape) == tensor.shapes.end()) {
      problems.push_back(fmt::format("{}: shape {}, expected {} = {}", name, shape_text(info.shape),
                                     shape_text(tensor.shapes.front()), tensor.formula));
    }
  }

  for (const auto& name : file.names()) {
    if (!name.starts_with(prefix) || expected_names.count(name) != 0) continue;
    const std::string_view relative = std::string_view(name).substr(prefix.size());
    const bool attention_owned =
        relative.starts_with(kAttentionNamespace) || relative.starts_with(kInputNormNamespace);
    if (!attention_owned || relative.starts_with(kDerivedBuffers) || is_kv_scale_name(relative) ||
        is_unread_activation_scale(relative, config))
      continue;
    problems.push_back(fmt::format("{}: present but unused ({} {}): {}", name,
                                   to_string(file.info(name).dtype), shape_text(file.info(name).shape),
                                   unused_reason(relative, config)));
  }
  return problems;
}

// Rows [first, first + count) of a tensor's outermost dimension, copied: how a fused [q; k; v] is split.
HostTensor copy_rows(const SafetensorsFile& file, const std::string& name, std::int64_t first,
                     std::int64_t count) {
  const TensorInfo& info = file.info(name);
  const std::span<const std::uint8_t> bytes = file.bytes(name);
  const auto outer = static_cast<std::uint64_t>(info.shape.at(0));
  const auto row_bytes = static_cast<std::size_t>(outer == 0 ? 0 : info.byte_size() / outer);
  HostTensor rows{info.dtype, info.shape, {}};
  rows.shape[0] = count;
  const auto begin = bytes.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first) * row_bytes);
  rows.bytes.assign(begin, begin + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(count) * row_bytes));
  return rows;
}

std::optional<HostTensor> read_if(bool wanted, const SafetensorsFile& file, const std::string& name) {
  if (!wanted) return std::nullopt;
  return read_tensor(file, name);
}

// Checks that a HostTensor's bytes match its shape before its elements are read.
void check_byte_count(const HostTensor& tensor, std::string_view operation) {
  const auto count = checked_product(tensor.shape);
  const auto bytes = count ? checked_multiply(*count, element_size(tensor.dtype)) : std::nullopt;
  if (!bytes || *bytes != tensor.bytes.size()) {
    throw Error(Stage::input,
                fmt::format("{}: {} bytes do not match shape {} of {}", operation, tensor.bytes.size(),
                            shape_text(tensor.shape), to_string(tensor.dtype)));
  }
}

// The conversions read BF16, F16, F32 and F64 only, and only tensors whose bytes match their shape.
void check_floating(const HostTensor& tensor, std::string_view operation) {
  if (tensor.dtype != Dtype::bf16 && tensor.dtype != Dtype::f16 && tensor.dtype != Dtype::f32 &&
      tensor.dtype != Dtype::f64) {
    throw Error(Stage::input,
                fmt::format("{}: dtype {} is not BF16, F16, F32 or F64", operation, to_string(tensor.dtype)));
  }
  check_byte_count(tensor, operation);
}

template <class Element>
Element element_at(const HostTensor& tensor, std::size_t index) {
  Element value;
  std::memcpy(&value, tensor.bytes.data() + index * sizeof(Element), sizeof(Element));
  return value;
}

// Row-wise concatenation of tensors with equal dtype and equal extents past the first: [a; b; c].
HostTensor concatenate_rows(std::span<const HostTensor* const> parts, std::string_view what) {
  HostTensor joined{parts[0]->dtype, parts[0]->shape, {}};
  joined.shape.at(0) = 0;
  for (const HostTensor* part : parts) {
    const bool same_rows = part->shape.size() == joined.shape.size() && !part->shape.empty() &&
                           std::equal(part->shape.begin() + 1, part->shape.end(), joined.shape.begin() + 1);
    if (part->dtype != joined.dtype || !same_rows) {
      throw Error(Stage::input,
                  fmt::format("save_layer_weights: cannot fuse {}: {} {} does not stack with {} {}", what,
                              to_string(part->dtype), shape_text(part->shape), to_string(parts[0]->dtype),
                              shape_text(parts[0]->shape)));
    }
    joined.shape[0] += part->shape[0];
    joined.bytes.insert(joined.bytes.end(), part->bytes.begin(), part->bytes.end());
  }
  return joined;
}

void add_tensor(SafetensorsWriter& writer, const std::string& name, const HostTensor& tensor) {
  writer.add(name, tensor.dtype, tensor.shape, tensor.bytes);
}

}  // namespace

std::uint64_t HostTensor::element_count() const noexcept {
  return checked_product(shape).value_or(0);
}

HostTensor bf16_tensor(std::vector<std::int64_t> shape, std::span<const std::uint16_t> bits) {
  HostTensor tensor{Dtype::bf16, std::move(shape),
                    std::vector<std::uint8_t>(bits.size() * sizeof(std::uint16_t))};
  if (!bits.empty()) std::memcpy(tensor.bytes.data(), bits.data(), tensor.bytes.size());
  check_byte_count(tensor, "bf16_tensor");
  return tensor;
}

HostTensor read_tensor(const SafetensorsFile& file, std::string_view name) {
  const TensorInfo& info = file.info(name);
  const std::span<const std::uint8_t> bytes = file.bytes(name);
  return HostTensor{info.dtype, info.shape, {bytes.begin(), bytes.end()}};
}

std::vector<double> to_doubles(const HostTensor& tensor) {
  check_floating(tensor, "to_doubles");
  std::vector<double> values(tensor.bytes.size() / element_size(tensor.dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (tensor.dtype) {
      case Dtype::bf16:
        values[i] = core::bf16_to_float(element_at<std::uint16_t>(tensor, i));
        break;
      case Dtype::f16:
        values[i] = f16_to_float(element_at<std::uint16_t>(tensor, i));
        break;
      case Dtype::f32:
        values[i] = element_at<float>(tensor, i);
        break;
      default:
        values[i] = element_at<double>(tensor, i);
        break;  // f64, as check_floating left no other
    }
  }
  return values;
}

std::vector<std::uint16_t> to_bf16_bits(const HostTensor& tensor) {
  check_floating(tensor, "to_bf16_bits");
  std::vector<std::uint16_t> bits(tensor.bytes.size() / element_size(tensor.dtype));
  for (std::size_t i = 0; i < bits.size(); ++i) {
    switch (tensor.dtype) {
      case Dtype::bf16:
        bits[i] = element_at<std::uint16_t>(tensor, i);
        break;
      // A half widens to float exactly, so this rounds once.
      case Dtype::f16:
        bits[i] = core::float_to_bf16(f16_to_float(element_at<std::uint16_t>(tensor, i)));
        break;
      case Dtype::f32:
        bits[i] = core::float_to_bf16(element_at<float>(tensor, i));
        break;
      default:
        bits[i] = core::double_to_bf16(element_at<double>(tensor, i));
        break;  // f64
    }
  }
  return bits;
}

namespace {

// The role's tensor of a quantized projection, where the loader and the saver keep it.
std::optional<HostTensor>* role_slot(QuantizationTensors& quant, TensorRole role) {
  switch (role) {
    case TensorRole::scales:
      return &quant.scales;
    case TensorRole::scale_2:
      return &quant.scale_2;
    case TensorRole::zeros:
      return &quant.zeros;
    case TensorRole::g_idx:
      return &quant.g_idx;
    case TensorRole::weight:
      break;
  }
  return nullptr;
}

// Reads one projection's tensors (already checked) into `weight` and `quant`.
void read_projection(const SafetensorsFile& file, const config::WeightEncoding& encoding,
                     const std::string& prefix, const std::string& base, std::int64_t n, std::int64_t k,
                     HostTensor& weight, QuantizationTensors& quant) {
  const bool gpt_oss = uses_gpt_oss_names(file, encoding, prefix, base);
  for (const auto& rule : projection_tensor_rules(encoding, base, n, k, gpt_oss)) {
    const std::string name = prefix + rule.relative;
    if (rule.optional && !file.contains(name)) continue;
    if (rule.role == TensorRole::weight) {
      weight = read_tensor(file, name);
      if (gpt_oss) weight.shape = {n, k / 2};  // [N, K/32, 16] bytes are the [N, K/2] bytes
    } else {
      *role_slot(quant, rule.role) = read_tensor(file, name);
    }
  }
}

void write_projection(SafetensorsWriter& writer, const config::WeightEncoding& encoding,
                      const std::string& prefix, const std::string& base, const HostTensor& weight,
                      const QuantizationTensors& quant, std::int64_t n, std::int64_t k) {
  QuantizationTensors copy = quant;
  for (const auto& rule : projection_tensor_rules(encoding, base, n, k)) {
    const std::string name = prefix + rule.relative;
    if (rule.role == TensorRole::weight) {
      add_tensor(writer, name, weight);
    } else if (const auto& tensor = *role_slot(copy, rule.role); tensor) {
      add_tensor(writer, name, *tensor);
    } else if (!rule.optional) {
      throw Error(Stage::input, fmt::format("save_layer_weights: {} has no tensor for {} ({} format)", base,
                                            rule.relative, config::to_string(encoding.format)));
    }
  }
}

// W [N, K] of a projection from its stored weight tensor: GPTQ/AWQ store [K, N]-major, the others [N, ...].
std::pair<std::int64_t, std::int64_t> logical_shape(const config::WeightEncoding& encoding,
                                                    const HostTensor& weight) {
  const std::int64_t rows = weight.shape.at(0), columns = weight.shape.at(1);
  switch (encoding.format) {
    case config::WeightFormat::bf16:
    case config::WeightFormat::fp8:
    case config::WeightFormat::mxfp8:
      return {rows, columns};
    case config::WeightFormat::mxfp4:
    case config::WeightFormat::nvfp4:
      return {rows, columns * 2};
    case config::WeightFormat::affine:
      return {rows, columns * 32 / encoding.bits};
    case config::WeightFormat::packed_integer:
      if (encoding.scheme == config::PackedIntegerScheme::awq)
        return {columns * values_per_word(encoding), rows};
      return {columns, rows * values_per_word(encoding)};
  }
  return {rows, columns};
}

}  // namespace

HostLayerWeights load_layer_weights(const SafetensorsFile& file, const config::AttentionConfig& config,
                                    const std::string& prefix) {
  if (config.projection.fused_qkv && config.projection.qkv.format != config::WeightFormat::bf16) {
    throw Error(
        Stage::input,
        fmt::format("projection.fused_qkv with format {} is not supported (a fused qkv_proj is loaded "
                    "as bf16 only; loading \"{}\" from {})",
                    config::to_string(config.projection.qkv.format), prefix, file.path().string()));
  }
  const bool fused = config.projection.fused_qkv;
  const bool fused_bias = fused && config.qkv_bias && file.contains(prefix + "self_attn.qkv_proj.bias");
  std::vector<std::string> problems =
      check_layer(file, config, prefix, expected_tensors(file, config, prefix, fused_bias));
  std::optional<KvCacheScales> kv_scales = read_kv_cache_scales(file, config, prefix, problems);
  throw_if_problems(std::move(problems), "in the attention weights", prefix, file);

  // Every tensor below was checked above: present, dtype and shape as expected.
  const std::int64_t q_rows = std::int64_t{config.query_heads} * config.head_dim;
  const std::int64_t k_rows = std::int64_t{config.kv_heads} * config.head_dim;
  const std::int64_t v_rows = std::int64_t{config.kv_heads} * config.value_head_dim;
  const std::string attention = prefix + std::string(kAttentionNamespace);

  HostLayerWeights weights;
  weights.input_norm = read_tensor(file, prefix + "input_layernorm.weight");
  if (fused) {
    const std::string name = attention + "qkv_proj.weight";  // [q; k; v] by rows
    weights.q_proj = copy_rows(file, name, 0, q_rows);
    weights.k_proj = copy_rows(file, name, q_rows, k_rows);
    weights.v_proj = copy_rows(file, name, q_rows + k_rows, v_rows);
  } else {
    const auto& qkv = config.projection.qkv;
    read_projection(file, qkv, prefix, "self_attn.q_proj", q_rows, config.hidden_size, weights.q_proj,
                    weights.q_quant);
    read_projection(file, qkv, prefix, "self_attn.k_proj", k_rows, config.hidden_size, weights.k_proj,
                    weights.k_quant);
    read_projection(file, qkv, prefix, "self_attn.v_proj", v_rows, config.hidden_size, weights.v_proj,
                    weights.v_quant);
  }
  if (fused_bias) {
    const std::string name = attention + "qkv_proj.bias";
    weights.q_bias = copy_rows(file, name, 0, q_rows);
    weights.k_bias = copy_rows(file, name, q_rows, k_rows);
    weights.v_bias = copy_rows(file, name, q_rows + k_rows, v_rows);
  } else {
    weights.q_bias = read_if(config.qkv_bias, file, attention + "q_proj.bias");
    weights.k_bias = read_if(config.qkv_bias, file, attention + "k_proj.bias");
    weights.v_bias = read_if(config.qkv_bias, file, attention + "v_proj.bias");
  }
  weights.q_norm = read_if(config.qkv_norm.query, file, attention + "q_norm.weight");
  weights.k_norm = read_if(config.qkv_norm.key, file, attention + "k_norm.weight");
  read_projection(file, config.projection.output, prefix, "self_attn.o_proj", config.hidden_size,
                  std::int64_t{config.query_heads} * config.value_head_dim, weights.o_proj, weights.o_quant);
  weights.o_bias = read_if(config.output_bias, file, attention + "o_proj.bias");
  weights.sinks = read_if(config.sinks, file, attention + "sinks");
  weights.kv_scales = std::move(kv_scales);
  return weights;
}

void save_layer_weights(SafetensorsWriter& writer, const HostLayerWeights& weights, const std::string& prefix,
                        bool fused_qkv) {
  config::Projection projection;
  projection.fused_qkv = fused_qkv;
  save_layer_weights(writer, weights, prefix, projection);
}

void save_layer_weights(SafetensorsWriter& writer, const HostLayerWeights& weights, const std::string& prefix,
                        const config::Projection& projection) {
  const bool fused_qkv = projection.fused_qkv;
  if (fused_qkv && projection.qkv.format != config::WeightFormat::bf16) {
    throw Error(Stage::input, fmt::format("save_layer_weights: cannot fuse q/k/v_proj in format {}",
                                          config::to_string(projection.qkv.format)));
  }
  const auto write = [&](const config::WeightEncoding& encoding, const std::string& base,
                         const HostTensor& weight, const QuantizationTensors& quant) {
    const auto [n, k] = logical_shape(encoding, weight);
    write_projection(writer, encoding, prefix, base, weight, quant, n, k);
  };
  const std::string attention = prefix + std::string(kAttentionNamespace);
  add_tensor(writer, prefix + "input_layernorm.weight", weights.input_norm);
  if (fused_qkv) {
    const HostTensor* projections[] = {&weights.q_proj, &weights.k_proj, &weights.v_proj};
    add_tensor(writer, attention + "qkv_proj.weight", concatenate_rows(projections, "q/k/v_proj weights"));
    const int biases =
        int{weights.q_bias.has_value()} + int{weights.k_bias.has_value()} + int{weights.v_bias.has_value()};
    if (biases == 3) {
      const HostTensor* parts[] = {&*weights.q_bias, &*weights.k_bias, &*weights.v_bias};
      add_tensor(writer, attention + "qkv_proj.bias", concatenate_rows(parts, "q/k/v biases"));
    } else if (biases != 0) {
      throw Error(Stage::input,
                  fmt::format("save_layer_weights: cannot fuse q/k/v biases: only {} of 3 present", biases));
    }
  } else {
    write(projection.qkv, "self_attn.q_proj", weights.q_proj, weights.q_quant);
    write(projection.qkv, "self_attn.k_proj", weights.k_proj, weights.k_quant);
    write(projection.qkv, "self_attn.v_proj", weights.v_proj, weights.v_quant);
    if (weights.q_bias) add_tensor(writer, attention + "q_proj.bias", *weights.q_bias);
    if (weights.k_bias) add_tensor(writer, attention + "k_proj.bias", *weights.k_bias);
    if (weights.v_bias) add_tensor(writer, attention + "v_proj.bias", *weights.v_bias);
  }
  if (weights.q_norm) add_tensor(writer, attention + "q_norm.weight", *weights.q_norm);
  if (weights.k_norm) add_tensor(writer, attention + "k_norm.weight", *weights.k_norm);
  write(projection.output, "self_attn.o_proj", weights.o_proj, weights.o_quant);
  if (weights.o_bias) add_tensor(writer, attention + "o_proj.bias", *weights.o_bias);
  if (weights.sinks) add_tensor(writer, attention + "sinks", *weights.sinks);
}

}  // namespace attnplan::io
