// The config module's entry points: JSON text or a JSON value in, a validated AttentionConfig out,
// and back. Every problem found names its JSON Pointer path ("/rotary/pairing_dim: ...").
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/attention_config.hpp"

namespace attnplan::config {

// Read, resolve defaults and validate. Every problem (syntax, schema, types, unknown keys, broken
// rules) is collected and thrown together as one Error(Stage::config): message() counts them and
// names the source, details() holds one "<json pointer>: <rule>" line per problem.
AttentionConfig parse(const nlohmann::json& document, std::string_view source_name = "config");
AttentionConfig parse_text(std::string_view json_text, std::string_view source_name);
AttentionConfig load_file(const std::filesystem::path& path);

// Fills what is left unset: kv_heads, head_dim, value_head_dim (0 = unset), the rotary dims,
// qkv_norm.epsilon, attention_scale and yarn's attention_factor. Leaves a field unset when its
// default cannot be derived (head_dim when hidden_size % query_heads != 0); validate() reports it.
void resolve_defaults(AttentionConfig& config);

// Every rule broken by a config as it is (call resolve_defaults first for one built in code);
// one "<json pointer>: <rule>" line per problem, empty when valid.
std::vector<std::string> validate(const AttentionConfig& config);

// Throws the Error parse() would throw when validate() finds problems.
void check(const AttentionConfig& config, std::string_view source_name = "config");

// The canonical JSON: defaults resolved and written out, unset optionals as null, only the
// parameters that belong to the chosen projection format and scaling type. parse() reads it back
// to an equal config.
nlohmann::json to_json(const AttentionConfig& config);

}  // namespace attnplan::config
