// The cache's part of an entry manifest: the fields it adds on publish and the checks it runs on load.
// Everything else in a manifest comes from the build callback and is stored without interpretation.
// Internal to cache/; the fields are described in docs/cache.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace attnplan::cache {

// "2025-01-31T12:34:56Z"
std::string iso8601_utc(std::chrono::system_clock::time_point time);

// The build callback's fields (a JSON object or null) plus format_version, key, cubin_sha256,
// cubin_bytes, created and, with PTX, ptx_sha256 and ptx_bytes. Throws Error(internal) when `supplied`
// is neither an object nor null: the cache cannot merge into it.
nlohmann::json compose_manifest(const std::string& key, const std::vector<std::uint8_t>& cubin,
                                const std::string& ptx, const nlohmann::json& supplied,
                                std::chrono::system_clock::time_point created);

// Parses a manifest and checks the fields the cache owns against the key it is filed under. On success
// `problem` is empty.
struct ParsedManifest {
  nlohmann::json json;  // null when the text does not parse
  std::string problem;
};
ParsedManifest parse_manifest(const std::string& text, std::string_view key);

// What is wrong with `cubin` given its (already checked) manifest: size first, then SHA-256.
// Empty when it matches.
std::string cubin_problem(const nlohmann::json& manifest, const std::vector<std::uint8_t>& cubin);

// The same for the optional PTX; a manifest without ptx_sha256 accepts no PTX file as a match.
std::string ptx_problem(const nlohmann::json& manifest, const std::string& ptx);

}  // namespace attnplan::cache
