#include "cli.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/error.hpp"

namespace attnplan::cli {

Arguments::Arguments(int argc, char** argv, int first, const std::vector<OptionSpec>& options) {
  for (int i = first; i < argc; ++i) {
    std::string token = argv[i];
    if (token.size() < 2 || token[0] != '-' || token == "-") {
      positional_.push_back(token);
      continue;
    }
    std::optional<std::string> inline_value;
    if (auto equals = token.find('='); equals != std::string::npos) {
      inline_value = token.substr(equals + 1);
      token = token.substr(0, equals);
    }
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& option : options) {
      if (option.name == token) spec = &option;
    }
    if (spec == nullptr) throw UsageError{fmt::format("unknown option {}", token)};
    if (spec->value_name.empty()) {
      if (inline_value) throw UsageError{fmt::format("{} takes no value", token)};
      values_[token] = "";
    } else if (inline_value) {
      values_[token] = *inline_value;
    } else {
      if (i + 1 >= argc) throw UsageError{fmt::format("{} needs a value ({})", token, spec->value_name)};
      values_[token] = argv[++i];
    }
  }
}

std::optional<std::string> Arguments::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

const std::string& Arguments::only_positional(const std::string& what) const {
  if (positional_.empty()) throw UsageError{fmt::format("missing {}", what)};
  if (positional_.size() > 1)
    throw UsageError{fmt::format("expected one {}, got {}", what, positional_.size())};
  return positional_.front();
}

std::string usage(const Command& command) {
  std::string text = fmt::format("usage: attnplan {}\n\n{}\n", command.synopsis, command.description);
  if (!command.options.empty()) {
    text += "\noptions:\n";
    for (const OptionSpec& option : command.options) {
      std::string left = option.name + (option.value_name.empty() ? "" : " " + option.value_name);
      text += fmt::format("  {:<24} {}\n", left, option.help);
    }
  }
  return text;
}

bool bidirectional_mask_option(const Arguments& args, config::AttentionConfig& config) {
  const std::string mask = args.value("--mask").value_or("causal");
  if (mask != "causal" && mask != "bidirectional") {
    throw Error(Stage::input, fmt::format("--mask {}: expected causal or bidirectional", mask));
  }
  if (mask == "bidirectional") config.bidirectional_spans = true;
  return mask == "bidirectional";
}

int int_option(const Arguments& args, const std::string& name, int fallback, int minimum) {
  const std::optional<std::string> text = args.value(name);
  if (!text) return fallback;
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text->size() || value < minimum || value > (1 << 30)) {
    throw Error(Stage::input, fmt::format("{} {}: expected an integer >= {}", name, *text, minimum));
  }
  return static_cast<int>(value);
}

double positive_number_option(const Arguments& args, const std::string& name, double fallback) {
  const std::optional<std::string> text = args.value(name);
  if (!text) return fallback;
  std::size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text->size() || !std::isfinite(value) || !(value > 0.0))
    throw Error(Stage::input, fmt::format("{} {}: expected a number greater than 0", name, *text));
  return value;
}

}  // namespace attnplan::cli
