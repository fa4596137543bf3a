// A small command-line layer shared by the attnplan subcommands: declared options, --help text,
// and one exit-code rule (0 ok, 1 bad input or usage, 2 internal or compile failure).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/attention_config.hpp"

namespace attnplan::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 1;
inline constexpr int kExitFailure = 2;

// Thrown for command-line mistakes (unknown flag, missing value); reported with the command's usage.
struct UsageError {
  std::string message;
};

struct OptionSpec {
  std::string name;        // "--cache-dir"
  std::string value_name;  // "DIR"; empty for a flag
  std::string help;
};

class Arguments {
 public:
  // Parses argv[first..] against `options`; positional arguments are collected in order.
  Arguments(int argc, char** argv, int first, const std::vector<OptionSpec>& options);

  bool flag(const std::string& name) const { return values_.count(name) != 0; }
  std::optional<std::string> value(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // The single positional argument `what`; UsageError when there are none or several.
  const std::string& only_positional(const std::string& what) const;

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

struct Command {
  std::string name;
  std::string synopsis;     // "compile CONFIG [--arch A] [--cache-dir D] [--json]"
  std::string description;  // a paragraph
  std::vector<OptionSpec> options;
  std::function<int(const Arguments&)> run;
};

std::string usage(const Command& command);

// The integer value of option `name` (`fallback` when absent); Error(input) naming the option unless it
// is a whole number in [minimum, 2^30].
int int_option(const Arguments& args, const std::string& name, int fallback, int minimum);

// Whether `--mask` asks for bidirectional attention: "causal" (the default) or "bidirectional"; Error(input)
// naming the option otherwise. The runtime is causal: the commands take bidirectional as one span over each
// chunk, so bidirectional also turns on `config`'s bidirectional_spans (the plan must then be built for
// spans).
bool bidirectional_mask_option(const Arguments& args, config::AttentionConfig& config);

// The number of option `name` (`fallback` when absent); Error(input) naming the option unless the whole
// text is a finite number greater than 0.
double positive_number_option(const Arguments& args, const std::string& name, double fallback);

}  // namespace attnplan::cli
