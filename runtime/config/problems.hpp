// How the config module reports: one Error(Stage::config) for all problems of one source.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace attnplan::config::detail {

// message(): "3 problems in plans/x.json"; details(): the problems, one "<json pointer>: <rule>" each.
[[noreturn]] void throw_problems(std::vector<std::string> problems, std::string_view source_name);

}  // namespace attnplan::config::detail
