// The one Error a loader throws for every problem it found in a checkpoint: a count, what was read, the
// layer prefix and the file in message(), one problem per details() line (the only one also in message()).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "io/safetensors.hpp"

namespace attnplan::io {

// Nothing when `problems` is empty; else throws Error(input), e.g. "2 problems in the attention weights
// under "model.layers.0." in model.safetensors".
inline void throw_if_problems(std::vector<std::string> problems, std::string_view subject,
                              const std::string& prefix, const SafetensorsFile& file) {
  if (problems.empty()) return;
  std::string message = fmt::format("{} problem{} {} under \"{}\" in {}", problems.size(),
                                    problems.size() == 1 ? "" : "s", subject, prefix, file.path().string());
  if (problems.size() == 1) message += ": " + problems.front();
  throw Error(Stage::input, std::move(message), {}, std::move(problems));
}

}  // namespace attnplan::io
