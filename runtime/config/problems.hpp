// How the config module reports: one Error(Stage::config) for all problems of one source.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace attnplan::config::detail {

// message(): "3 problems in plans/x.json"; details(): the problems, one "<json pointer>: <rule>" each.
[[noreturn]] void throw_problems(std::vector<std::string> problems, std::string_view source_name);

// One JSON Pointer token (RFC 6901): "~" and "/" inside a key are escaped so the path stays unambiguous.
std::string pointer_token(std::string_view key);

// What a value of the wrong type was: `string "1e-5"`, `number 4096.5`, `object`.
std::string describe(const nlohmann::json& value);

}  // namespace attnplan::config::detail
