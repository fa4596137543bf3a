// The HF config reader shared by the model families (hf_import.cpp) and the quantization configs
// (hf_quantization.cpp): one JSON object, the keys read from it, and its problems by HF JSON pointer.
// Internal to the config module.
#pragma once

#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/problems.hpp"

namespace attnplan::config::detail {

using json = nlohmann::json;

// One JSON object of the HF config (the top level, text_config, rope_scaling) and the keys read
// from it so far. Reading a key marks it known; `refuse_unknown` then reports every other key.
// null reads as absent, as HF's `None` does.
class Fields {
 public:
  Fields(const json& object, std::string prefix, std::vector<std::string>& problems)
      : object_(object), prefix_(std::move(prefix)), problems_(problems) {}

  std::string path(std::string_view key) const { return prefix_ + "/" + pointer_token(key); }
  const std::string& prefix() const { return prefix_; }
  std::vector<std::string>& problems() { return problems_; }
  bool has(std::string_view key) const { return get_unmarked(key) != nullptr; }

  void problem(std::string_view key, std::string_view rule) {
    problems_.push_back(fmt::format("{}: {}", path(key), rule));
  }

  const json* get(std::string_view key) {
    known_.insert(std::string(key));
    return get_unmarked(key);
  }

  // A value read without marking it known: for a neighbour's fallback (yarn's max positions).
  const json* get_unmarked(std::string_view key) const {
    const auto it = object_.find(std::string(key));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<std::int64_t> integer(std::string_view key) {
    const json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number_integer()) {
      problem(key, fmt::format("expected an integer, got {}", describe(*value)));
      return std::nullopt;
    }
    return value->get<std::int64_t>();
  }

  // A count or size: a positive integer that fits attnplan's int fields.
  std::optional<int> positive(std::string_view key) {
    const std::optional<std::int64_t> value = integer(key);
    if (!value) return std::nullopt;
    if (*value <= 0 || *value > INT_MAX) {
      problem(key, fmt::format("expected a positive integer, got {}", *value));
      return std::nullopt;
    }
    return static_cast<int>(*value);
  }

  int required_positive(std::string_view key) {
    if (get_unmarked(key) == nullptr) {
      get(key);
      problem(key, "required");
      return 0;
    }
    return positive(key).value_or(0);
  }

  std::optional<double> number(std::string_view key) {
    const json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number()) {
      problem(key, fmt::format("expected a number, got {}", describe(*value)));
      return std::nullopt;
    }
    return value->get<double>();
  }

  std::optional<bool> boolean(std::string_view key) {
    const json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_boolean()) {
      problem(key, fmt::format("expected true or false, got {}", describe(*value)));
      return std::nullopt;
    }
    return value->get<bool>();
  }

  std::optional<std::string> string(std::string_view key) {
    const json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) {
      problem(key, fmt::format("expected a string, got {}", describe(*value)));
      return std::nullopt;
    }
    return value->get<std::string>();
  }

  void irrelevant(std::initializer_list<std::string_view> keys) {
    for (std::string_view key : keys) known_.insert(std::string(key));
  }
  template <class Keys>
  void irrelevant_all(const Keys& keys) {
    for (std::string_view key : keys) known_.insert(std::string(key));
  }
  const json& object() const { return object_; }

  // Keys neither read nor listed irrelevant: one problem naming them all.
  void refuse_unknown(std::string_view family) {
    std::string unknown;
    for (const auto& [key, value] : object_.items()) {
      if (known_.count(key) != 0) continue;
      unknown += unknown.empty() ? key : ", " + key;
    }
    if (unknown.empty()) return;
    const std::string where = prefix_.empty() ? "" : fmt::format(" (under {})", prefix_);
    problems_.push_back(fmt::format("unsupported HF config fields for {}{}: {}", family, where, unknown));
  }

  // Keys not read, each reported as not belonging to `owner` (rope_scaling parameters).
  void refuse_unknown_parameters(std::string_view owner) {
    for (const auto& [key, value] : object_.items()) {
      if (known_.count(key) == 0) problem(key, fmt::format("not a parameter of {}", owner));
    }
  }

 private:
  const json& object_;
  std::string prefix_;
  std::vector<std::string>& problems_;
  std::set<std::string, std::less<>> known_;
};

}  // namespace attnplan::config::detail
