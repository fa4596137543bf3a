// Helpers shared by the config tests: a minimal valid document and the problems parse() reports.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/parse.hpp"
#include "core/error.hpp"
#include "support/catch.hpp"

namespace attnplan::config::testing {

// The smallest valid config: the schema and the two required sizes (head_dim 128 by default).
inline nlohmann::json minimal_document() {
  return {{"schema", "attnplan/v1"}, {"hidden_size", 4096}, {"query_heads", 32}};
}

// minimal_document() with `patch` merged in (RFC 7386: nested objects merge, null removes a key).
inline nlohmann::json document_with(const nlohmann::json& patch) {
  nlohmann::json document = minimal_document();
  document.merge_patch(patch);
  return document;
}

// The details of the Error parse() throws, or nothing when the document is valid.
inline std::vector<std::string> problems_of(const nlohmann::json& document) {
  try {
    parse(document, "test");
  } catch (const Error& error) {
    return error.details();
  }
  return {};
}

inline bool has_problem(const std::vector<std::string>& problems, std::string_view prefix) {
  return std::any_of(problems.begin(), problems.end(),
                     [&](const std::string& problem) { return problem.starts_with(prefix); });
}

// The document has exactly one problem, and it starts with `prefix` (its path and the rule): a rule
// reports itself once and drags no derived complaints along.
inline void require_only_problem(const nlohmann::json& document, std::string_view prefix) {
  const std::vector<std::string> problems = problems_of(document);
  INFO("document: " << document.dump());
  CAPTURE(problems, prefix);
  REQUIRE(problems.size() == 1);
  REQUIRE(problems.front().starts_with(prefix));
}

}  // namespace attnplan::config::testing
