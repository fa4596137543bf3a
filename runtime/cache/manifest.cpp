#include "cache/manifest.hpp"

#include <ctime>

#include <fmt/format.h>

#include "cache/cubin_cache.hpp"
#include "core/error.hpp"
#include "core/sha256.hpp"

namespace attnplan::cache {
namespace {

bool is_sha256_hex(const nlohmann::json& value) {
  return value.is_string() && is_valid_key(value.get_ref<const std::string&>());
}

// Checks one hashed payload (cubin or PTX) against `<prefix>_bytes` and `<prefix>_sha256`.
std::string payload_problem(const nlohmann::json& manifest, std::string_view prefix, const void* data,
                            std::size_t size) {
  const std::uint64_t recorded_bytes = manifest.at(fmt::format("{}_bytes", prefix)).get<std::uint64_t>();
  if (recorded_bytes != size) {
    return fmt::format("{} is {} bytes but the manifest records {}", prefix, size, recorded_bytes);
  }
  const std::string& recorded_sha =
      manifest.at(fmt::format("{}_sha256", prefix)).get_ref<const std::string&>();
  const std::string actual_sha = core::sha256_hex(data, size);
  if (actual_sha != recorded_sha) {
    return fmt::format("{} SHA-256 is {} but the manifest records {}", prefix, actual_sha, recorded_sha);
  }
  return {};
}

}  // namespace

std::string iso8601_utc(std::chrono::system_clock::time_point time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

nlohmann::json compose_manifest(const std::string& key, const std::vector<std::uint8_t>& cubin,
                                const std::string& ptx, const nlohmann::json& supplied,
                                std::chrono::system_clock::time_point created) {
  if (!supplied.is_null() && !supplied.is_object()) {
    throw Error(
        Stage::internal,
        fmt::format("the build of cache entry {} returned a manifest that is a JSON {}, not an object", key,
                    supplied.type_name()),
        supplied.dump(2));
  }
  nlohmann::json manifest = supplied.is_null() ? nlohmann::json::object() : supplied;
  manifest["format_version"] = kFormatVersion;
  manifest["key"] = key;
  manifest["cubin_sha256"] = core::sha256_hex(cubin.data(), cubin.size());
  manifest["cubin_bytes"] = static_cast<std::uint64_t>(cubin.size());
  // A stale PTX description must not survive from `supplied`: these two exist exactly when PTX does.
  manifest.erase("ptx_sha256");
  manifest.erase("ptx_bytes");
  if (!ptx.empty()) {
    manifest["ptx_sha256"] = core::sha256_hex(ptx);
    manifest["ptx_bytes"] = static_cast<std::uint64_t>(ptx.size());
  }
  manifest["created"] = iso8601_utc(created);
  return manifest;
}

ParsedManifest parse_manifest(const std::string& text, std::string_view key) {
  ParsedManifest parsed;
  try {
    parsed.json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    parsed.json = nullptr;
    parsed.problem = fmt::format("manifest is not valid JSON (syntax error at byte {})", error.byte);
    return parsed;
  } catch (const nlohmann::json::out_of_range&) {
    // A number literal beyond double's range ("1e400") is out_of_range, not parse_error; uncaught it
    // escaped find()/verify() instead of getting the entry quarantined.
    parsed.json = nullptr;
    parsed.problem = "manifest is not valid JSON (a number is out of range)";
    return parsed;
  }
  const nlohmann::json& json = parsed.json;
  if (!json.is_object()) {
    parsed.problem = fmt::format("manifest is a JSON {}, not an object", json.type_name());
  } else if (!json.contains("format_version") || json["format_version"] != kFormatVersion) {
    parsed.problem = fmt::format("manifest format_version is {}, expected {}",
                                 json.contains("format_version") ? json["format_version"].dump() : "missing",
                                 kFormatVersion);
  } else if (!json.contains("key") || !json["key"].is_string() ||
             json["key"].get_ref<const std::string&>() != key) {
    parsed.problem = fmt::format("manifest names key {} but is filed under {}",
                                 json.contains("key") ? json["key"].dump() : "(none)", key);
  } else if (!json.contains("cubin_sha256") || !is_sha256_hex(json["cubin_sha256"])) {
    parsed.problem = "manifest has no valid cubin_sha256";
  } else if (!json.contains("cubin_bytes") || !json["cubin_bytes"].is_number_unsigned()) {
    parsed.problem = "manifest has no valid cubin_bytes";
  } else if (json.contains("ptx_sha256") &&
             (!is_sha256_hex(json["ptx_sha256"]) || !json.contains("ptx_bytes") ||
              !json["ptx_bytes"].is_number_unsigned())) {
    parsed.problem = "manifest has an invalid ptx_sha256 or ptx_bytes";
  }
  return parsed;
}

std::string cubin_problem(const nlohmann::json& manifest, const std::vector<std::uint8_t>& cubin) {
  return payload_problem(manifest, "cubin", cubin.data(), cubin.size());
}

std::string ptx_problem(const nlohmann::json& manifest, const std::string& ptx) {
  if (!manifest.contains("ptx_sha256")) return "the manifest records no PTX";
  return payload_problem(manifest, "ptx", ptx.data(), ptx.size());
}

}  // namespace attnplan::cache
