// JSON -> AttentionConfig. Reading records every problem it meets (types, unknown keys, parameters of
// another format) and carries on, so that one run reports them all; validate() then adds the rules.
#include "config/parse.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "config/enum_names.hpp"
#include "config/problems.hpp"
#include "core/error.hpp"
#include "core/files.hpp"

namespace attnplan::config {
namespace {

using detail::describe;
using detail::pointer_token;

using nlohmann::json;
using Keys = std::span<const std::string_view>;

template <std::size_t N, std::size_t M>
constexpr std::array<std::string_view, N + M> concat(const std::array<std::string_view, N>& first,
                                                     const std::array<std::string_view, M>& second) {
  std::array<std::string_view, N + M> all{};
  std::copy(first.begin(), first.end(), all.begin());
  std::copy(second.begin(), second.end(), all.begin() + N);
  return all;
}

// The keys each object accepts, in the order docs/config.md lists them (unknown-key messages show them).
constexpr auto kRootKeys = std::to_array<std::string_view>(
    {"schema",          "name",       "hidden_size",    "query_heads",         "kv_heads", "head_dim",
     "value_head_dim",  "input_norm", "qkv_bias",       "output_bias",         "qkv_norm", "rotary",
     "attention_scale", "softcap",    "sliding_window", "bidirectional_spans", "sinks",    "projection",
     "kv_cache",        "max_tokens", "target"});
constexpr auto kInputNormKeys = std::to_array<std::string_view>({"epsilon", "weight_offset"});
constexpr auto kQkvNormKeys =
    std::to_array<std::string_view>({"query", "key", "value", "weight_offset", "epsilon"});
constexpr auto kRotaryKeys =
    std::to_array<std::string_view>({"offset", "dim", "pairing_dim", "theta", "scaling"});
constexpr auto kScalingParams =
    std::to_array<std::string_view>({"factor", "low_freq_factor", "high_freq_factor", "original_max_position",
                                     "beta_fast", "beta_slow", "truncate", "attention_factor"});
constexpr auto kScalingKeys = concat(std::to_array<std::string_view>({"type"}), kScalingParams);
constexpr auto kEncodingParams = std::to_array<std::string_view>(
    {"scale_granularity", "activation", "scheme", "bits", "group_size", "act_order"});
constexpr auto kEncodingKeys = concat(std::to_array<std::string_view>({"format"}), kEncodingParams);
constexpr auto kProjectionKeys =
    concat(kEncodingKeys, std::to_array<std::string_view>({"fused_qkv", "output"}));
constexpr auto kKvCacheKeys = std::to_array<std::string_view>({"block_size", "dtype", "k_scale", "v_scale"});
constexpr auto kTargetKeys = std::to_array<std::string_view>({"arch"});

// The parameters that belong to each format and scaling type; the others are refused when present.
Keys params_of(WeightFormat format) {
  static constexpr std::string_view fp8[] = {"scale_granularity", "activation"};
  static constexpr std::string_view packed_integer[] = {"scheme", "bits", "group_size", "act_order"};
  static constexpr std::string_view affine[] = {"bits", "group_size"};
  switch (format) {
    case WeightFormat::fp8:
      return fp8;
    case WeightFormat::packed_integer:
      return packed_integer;
    case WeightFormat::affine:
      return affine;
    default:
      return {};
  }
}

Keys params_of(RopeScalingType type) {
  static constexpr std::string_view linear[] = {"factor"};
  static constexpr std::string_view llama3[] = {"factor", "low_freq_factor", "high_freq_factor",
                                                "original_max_position"};
  static constexpr std::string_view yarn[] = {"factor",   "original_max_position", "beta_fast", "beta_slow",
                                              "truncate", "attention_factor"};
  switch (type) {
    case RopeScalingType::none:
      return {};
    case RopeScalingType::linear:
      return linear;
    case RopeScalingType::llama3:
      return llama3;
    case RopeScalingType::yarn:
      return yarn;
  }
  return {};
}

bool contains(Keys keys, std::string_view key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

std::string join(Keys keys) {
  std::string text;
  for (std::string_view key : keys) {
    if (!text.empty()) text += ", ";
    text += key;
  }
  return text;
}

// A JSON value as T, or nullopt with the reason in `problem`.
template <typename T>
std::optional<T> convert(const json& value, std::string& problem) {
  if constexpr (std::is_same_v<T, bool>) {
    if (value.is_boolean()) return value.get<bool>();
    problem = fmt::format("expected a boolean, got {}", describe(value));
  } else if constexpr (std::is_integral_v<T>) {
    if (!value.is_number_integer()) {
      problem = fmt::format("expected an integer, got {}", describe(value));
    } else if (value.is_number_unsigned()) {
      const auto number = value.get<std::uint64_t>();
      if (number <= static_cast<std::uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(number);
      problem = fmt::format("{} is out of range", number);
    } else {
      const auto number = value.get<std::int64_t>();
      if (number >= std::numeric_limits<T>::min() && number <= std::numeric_limits<T>::max()) {
        return static_cast<T>(number);
      }
      problem = fmt::format("{} is out of range", number);
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (value.is_number()) return value.get<T>();
    problem = fmt::format("expected a number, got {}", describe(value));
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (value.is_string()) return value.get<std::string>();
    problem = fmt::format("expected a string, got {}", describe(value));
  } else {
    static_assert(std::is_enum_v<T>);
    if (!value.is_string()) {
      problem = fmt::format("expected one of {}, got {}", detail::enum_name_list<T>(), describe(value));
    } else if (auto parsed = detail::enum_from_name<T>(value.get_ref<const std::string&>())) {
      return parsed;
    } else {
      problem = fmt::format("{} is not one of {}", value.dump(), detail::enum_name_list<T>());
    }
  }
  return std::nullopt;
}

// The problems found so far and where, so validation stays quiet about a field the reader already flagged.
class Report {
 public:
  void add(std::string path, std::string_view rule) {
    lines_.push_back(fmt::format("{}: {}", path, rule));
    paths_.push_back(std::move(path));
  }

  // True when `path` or an object above it already has a problem.
  bool flagged(std::string_view path) const {
    return std::any_of(paths_.begin(), paths_.end(), [&](const std::string& flagged_path) {
      return path.starts_with(flagged_path) &&
             (path.size() == flagged_path.size() || path[flagged_path.size()] == '/');
    });
  }

  std::vector<std::string> take_lines() { return std::move(lines_); }

 private:
  std::vector<std::string> lines_;
  std::vector<std::string> paths_;
};

// One JSON object of the config. Construction reports the keys it does not know; the read functions
// leave their target untouched when the key is absent or its value is wrong (and report the latter).
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string path, Report& report, Keys known)
      : object_(&object), path_(std::move(path)), report_(&report) {
    for (const auto& item : object.items()) {
      if (!contains(known, item.key())) {
        report.add(path_of(item.key()), fmt::format("unknown key (known: {})", join(known)));
      }
    }
  }

  std::string path_of(std::string_view key) const { return fmt::format("{}/{}", path_, pointer_token(key)); }
  bool has(std::string_view key) const { return find(key) != nullptr; }
  bool flagged(std::string_view key) const { return report_->flagged(path_of(key)); }
  void add_problem(std::string_view key, std::string_view rule) const { report_->add(path_of(key), rule); }

  template <typename T>
  std::optional<T> get(std::string_view key) const {
    const json* value = find(key);
    // A key reported already (refused for this format, say) is not read: one problem per path.
    if (value == nullptr || flagged(key)) return std::nullopt;
    std::string problem;
    std::optional<T> result = convert<T>(*value, problem);
    if (!result) add_problem(key, problem);
    return result;
  }

  template <typename T>
  void read(std::string_view key, T& out) const {
    if (std::optional<T> value = get<T>(key)) out = std::move(*value);
  }

  // For fields whose absence means something (a derived default, "none"): null says the same.
  template <typename T>
  void read(std::string_view key, std::optional<T>& out) const {
    const json* value = find(key);
    if (value == nullptr || value->is_null()) return;
    if (std::optional<T> converted = get<T>(key)) out = std::move(converted);
  }

  std::optional<ObjectReader> object(std::string_view key, Keys known) const {
    const json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_object()) {
      add_problem(key, fmt::format("expected an object, got {}", describe(*value)));
      return std::nullopt;
    }
    return ObjectReader(*value, path_of(key), *report_, known);
  }

  void require(std::string_view key, std::string_view rule) const {
    if (!has(key)) add_problem(key, rule);
  }

  // Keys of `all` that are present but not in `allowed` are reported with `rule`.
  void reject_others(Keys all, Keys allowed, std::string_view rule) const {
    for (std::string_view key : all) {
      if (has(key) && !contains(allowed, key)) add_problem(key, rule);
    }
  }

 private:
  const json* find(std::string_view key) const {
    const auto it = object_->find(std::string(key));
    return it == object_->end() ? nullptr : &*it;
  }

  const json* object_;
  std::string path_;
  Report* report_;
};

// kv_heads, head_dim and value_head_dim: 0 stands for "unset" in the struct, so an explicit 0 (or any
// value below 1) is refused here rather than silently replaced by the default.
void read_dimension(const ObjectReader& reader, std::string_view key, int& out) {
  std::optional<int> value;
  reader.read(key, value);
  if (!value) return;
  if (*value < 1) {
    reader.add_problem(key, fmt::format("must be positive, got {} (omit it for the default)", *value));
  } else {
    out = *value;
  }
}

// hidden_size and query_heads: every other size derives from them, so a missing or non-positive one
// is flagged here, which also tells parse_document that the rules have nothing sound to check.
void read_required_size(const ObjectReader& reader, std::string_view key, int& out) {
  reader.require(key, "required");
  reader.read(key, out);
  if (reader.has(key) && !reader.flagged(key) && out < 1) {
    reader.add_problem(key, fmt::format("must be positive, got {}", out));
  }
}

void read_encoding(const ObjectReader& reader, WeightEncoding& encoding) {
  reader.read("format", encoding.format);
  // Parameters cannot be judged against a format that was not understood.
  if (reader.flagged("format")) return;
  reader.reject_others(kEncodingParams, params_of(encoding.format),
                       fmt::format("not a parameter of format {}", to_string(encoding.format)));
  reader.read("scale_granularity", encoding.scale_granularity);
  reader.read("activation", encoding.activation);
  reader.read("scheme", encoding.scheme);
  reader.read("bits", encoding.bits);
  reader.read("group_size", encoding.group_size);
  reader.read("act_order", encoding.act_order);
}

void read_projection(const ObjectReader& reader, Projection& projection) {
  read_encoding(reader, projection.qkv);
  reader.read("fused_qkv", projection.fused_qkv);
  projection.output = projection.qkv;
  if (std::optional<ObjectReader> output = reader.object("output", kEncodingKeys)) {
    projection.output = WeightEncoding{};
    read_encoding(*output, projection.output);
  }
}

void read_scaling(const ObjectReader& reader, RopeScaling& scaling) {
  reader.read("type", scaling.type);
  if (reader.flagged("type")) return;
  const std::string_view type = to_string(scaling.type);
  const Keys params = params_of(scaling.type);
  reader.reject_others(kScalingParams, params, fmt::format("not a parameter of scaling type {}", type));
  // factor and the original context length have no neutral value: a scaling without them is a mistake.
  for (std::string_view key : {"factor", "original_max_position"}) {
    if (contains(params, key)) reader.require(key, fmt::format("required for scaling type {}", type));
  }
  reader.read("factor", scaling.factor);
  reader.read("low_freq_factor", scaling.low_freq_factor);
  reader.read("high_freq_factor", scaling.high_freq_factor);
  reader.read("original_max_position", scaling.original_max_position);
  reader.read("beta_fast", scaling.beta_fast);
  reader.read("beta_slow", scaling.beta_slow);
  reader.read("truncate", scaling.truncate);
  reader.read("attention_factor", scaling.attention_factor);
}

void read_rotary(const ObjectReader& reader, Rotary& rotary) {
  reader.read("offset", rotary.offset);
  reader.read("dim", rotary.dim);
  reader.read("pairing_dim", rotary.pairing_dim);
  reader.read("theta", rotary.theta);
  if (std::optional<ObjectReader> scaling = reader.object("scaling", kScalingKeys)) {
    read_scaling(*scaling, rotary.scaling);
  }
}

void read_target(const ObjectReader& reader, Target& target) {
  const std::optional<std::string> arch = reader.get<std::string>("arch");
  if (!arch || *arch == "auto") return;
  target.arch = parse_arch(*arch);
  if (!target.arch) {
    reader.add_problem(
        "arch", fmt::format("\"{}\" is not an architecture (expected \"auto\" or sm_<major><minor>[a], "
                            "e.g. sm_90a)",
                            *arch));
  }
}

AttentionConfig read_config(const ObjectReader& root) {
  AttentionConfig config;
  if (std::optional<std::string> schema = root.get<std::string>("schema")) {
    if (*schema != kSchema) {
      root.add_problem("schema", fmt::format("\"{}\" is not supported (expected \"{}\")", *schema, kSchema));
    }
  } else {
    root.require("schema", fmt::format("required: \"{}\"", kSchema));
  }
  root.read("name", config.name);

  read_required_size(root, "hidden_size", config.hidden_size);
  read_required_size(root, "query_heads", config.query_heads);
  read_dimension(root, "kv_heads", config.kv_heads);
  read_dimension(root, "head_dim", config.head_dim);
  read_dimension(root, "value_head_dim", config.value_head_dim);

  if (std::optional<ObjectReader> input_norm = root.object("input_norm", kInputNormKeys)) {
    input_norm->read("epsilon", config.input_norm.epsilon);
    input_norm->read("weight_offset", config.input_norm.weight_offset);
  }
  root.read("qkv_bias", config.qkv_bias);
  root.read("output_bias", config.output_bias);
  if (std::optional<ObjectReader> qkv_norm = root.object("qkv_norm", kQkvNormKeys)) {
    qkv_norm->read("query", config.qkv_norm.query);
    qkv_norm->read("key", config.qkv_norm.key);
    qkv_norm->read("value", config.qkv_norm.value);
    qkv_norm->read("weight_offset", config.qkv_norm.weight_offset);
    qkv_norm->read("epsilon", config.qkv_norm.epsilon);
  }
  if (std::optional<ObjectReader> rotary = root.object("rotary", kRotaryKeys)) {
    read_rotary(*rotary, config.rotary);
  }

  root.read("attention_scale", config.attention_scale);
  root.read("softcap", config.softcap);
  root.read("sliding_window", config.sliding_window);
  root.read("bidirectional_spans", config.bidirectional_spans);
  root.read("sinks", config.sinks);

  if (std::optional<ObjectReader> projection = root.object("projection", kProjectionKeys)) {
    read_projection(*projection, config.projection);
  }
  if (std::optional<ObjectReader> kv_cache = root.object("kv_cache", kKvCacheKeys)) {
    kv_cache->read("block_size", config.kv_cache.block_size);
    kv_cache->read("dtype", config.kv_cache.dtype);
    kv_cache->read("k_scale", config.kv_cache.k_scale);
    kv_cache->read("v_scale", config.kv_cache.v_scale);
  }
  root.read("max_tokens", config.max_tokens);
  if (std::optional<ObjectReader> target = root.object("target", kTargetKeys)) {
    read_target(*target, config.target);
  }
  return config;
}

// nlohmann keeps the last of two equal keys without a word; a config that sets "sliding_window" twice
// is a mistake worth reporting. The parser callback sees every key with its nesting, enough to
// rebuild the path of each repeated one.
class DuplicateKeyFinder {
 public:
  bool on_event(json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        levels_.push_back({});
        break;
      case json::parse_event_t::array_start:
        levels_.push_back({.is_array = true});
        break;
      case json::parse_event_t::key:
        levels_.back().key = parsed.get<std::string>();
        if (!levels_.back().keys_seen.insert(levels_.back().key).second) {
          duplicates_.push_back(current_path());
        }
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        levels_.pop_back();
        next_element();
        break;
      case json::parse_event_t::value:
        next_element();
        break;
    }
    return true;
  }

  const std::vector<std::string>& duplicates() const { return duplicates_; }

 private:
  struct Level {
    bool is_array = false;
    std::size_t index = 0;  // arrays: the element being read
    std::string key;        // objects: the key being read
    std::set<std::string> keys_seen;
  };

  void next_element() {
    if (!levels_.empty() && levels_.back().is_array) ++levels_.back().index;
  }

  std::string current_path() const {
    std::string path;
    for (const Level& level : levels_) {
      path += '/';
      path += level.is_array ? std::to_string(level.index) : pointer_token(level.key);
    }
    return path;
  }

  std::vector<Level> levels_;
  std::vector<std::string> duplicates_;
};

AttentionConfig parse_document(const json& document, std::string_view source_name, Report report) {
  if (!document.is_object()) {
    report.add("/", fmt::format("expected an object, got {}", describe(document)));
    detail::throw_problems(report.take_lines(), source_name);
  }
  const ObjectReader root(document, "", report, kRootKeys);
  AttentionConfig config = read_config(root);
  resolve_defaults(config);

  // Everything derives from the two required sizes: without them the rules would only echo that.
  const bool rules_apply = !report.flagged("/hidden_size") && !report.flagged("/query_heads");
  std::vector<std::string> problems = report.take_lines();
  if (rules_apply) {
    for (std::string& line : validate(config)) {
      if (!report.flagged(std::string_view(line).substr(0, line.find(": ")))) {
        problems.push_back(std::move(line));
      }
    }
  }
  if (!problems.empty()) detail::throw_problems(std::move(problems), source_name);
  return config;
}

// nlohmann counts `byte` as characters read, so the offending one is at byte - 1.
Error syntax_error(std::string_view text, std::string_view source_name, const json::parse_error& error) {
  const std::size_t offset = std::min<std::size_t>(error.byte > 0 ? error.byte - 1 : 0, text.size());
  const std::size_t line_start = offset == 0 ? 0 : text.rfind('\n', offset - 1) + 1;  // npos + 1 == 0
  const std::size_t line =
      1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + offset, '\n'));
  const std::size_t column = offset - line_start + 1;

  // what(): "[json.exception.parse_error.101] parse error at line 3, column 5: <reason>"
  std::string_view reason = error.what();
  if (const std::size_t at = reason.find(": ", reason.find("column ")); at != std::string_view::npos) {
    reason.remove_prefix(at + 2);
  }
  std::string_view line_text = text.substr(line_start);
  line_text = line_text.substr(0, line_text.find('\n'));
  return Error(Stage::config,
               fmt::format("invalid JSON in {} at line {}, column {}", source_name, line, column),
               fmt::format("{}\n{}^", line_text, std::string(column - 1, ' ')),
               {fmt::format("line {}, column {}: {}", line, column, reason)});
}

}  // namespace

AttentionConfig parse(const nlohmann::json& document, std::string_view source_name) {
  return parse_document(document, source_name, Report{});
}

AttentionConfig parse_text(std::string_view json_text, std::string_view source_name) {
  DuplicateKeyFinder finder;
  json document;
  try {
    document = json::parse(json_text.begin(), json_text.end(),
                           [&finder](int /*depth*/, json::parse_event_t event, json& parsed) {
                             return finder.on_event(event, parsed);
                           });
  } catch (const json::parse_error& error) {
    throw syntax_error(json_text, source_name, error);
  } catch (const json::out_of_range& error) {
    // nlohmann reports a number literal beyond double's range ("1e400") as out_of_range, not as a
    // parse_error, and without a position: still bad input, so still Error(config).
    throw Error(Stage::config, fmt::format("invalid JSON in {}: a number is out of range", source_name), {},
                {error.what()});
  }
  Report report;
  for (const std::string& path : finder.duplicates()) {
    report.add(path, "duplicate key (JSON keeps only the last)");
  }
  return parse_document(document, source_name, std::move(report));
}

AttentionConfig load_file(const std::filesystem::path& path) {
  return parse_text(core::read_text_file(path), path.string());
}

}  // namespace attnplan::config
