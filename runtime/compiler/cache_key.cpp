#include "compiler/cache_key.hpp"

#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "core/sha256.hpp"

namespace attnplan::compiler {

namespace {

// Written in place of the toolkit's install prefix in -I options.
constexpr const char* kToolkitPlaceholder = "<cuda>";

std::string portable_include_option(const Toolkit& toolkit, const std::filesystem::path& dir,
                                    std::size_t index) {
  const std::filesystem::path relative =
      dir.lexically_normal().lexically_relative(toolkit.root.lexically_normal());
  const std::string text = relative.generic_string();
  if (relative.empty() || text == ".." || text.rfind("../", 0) == 0) {
    // An include dir outside the root is still a toolkit dir: name it by position, not by path.
    return fmt::format("-I{}/include-dir-{}", kToolkitPlaceholder, index);
  }
  return fmt::format("-I{}/{}", kToolkitPlaceholder, text);
}

template <class T>
T field(const nlohmann::json& json, const char* name) {
  try {
    return json.at(name).get<T>();
  } catch (const nlohmann::json::exception& error) {
    throw Error(Stage::cache, fmt::format("key inputs: field \"{}\" missing or malformed", name),
                error.what());
  }
}

}  // namespace

nlohmann::json KeyInputs::to_json() const {
  nlohmann::json headers_json = nlohmann::json::array();
  for (const auto& [name, sha256] : headers) headers_json.push_back({{"name", name}, {"sha256", sha256}});
  return {{"format_version", format_version},
          {"nvrtc_version", nvrtc_version},
          {"toolkit_headers", toolkit_headers},
          {"arch", arch},
          {"options", options},
          {"stub", stub},
          {"headers", std::move(headers_json)}};
}

KeyInputs KeyInputs::from_json(const nlohmann::json& json) {
  if (!json.is_object()) throw Error(Stage::cache, "key inputs: not a JSON object");
  KeyInputs inputs;
  inputs.format_version = field<int>(json, "format_version");
  inputs.nvrtc_version = field<std::string>(json, "nvrtc_version");
  inputs.toolkit_headers = field<std::string>(json, "toolkit_headers");
  inputs.arch = field<std::string>(json, "arch");
  inputs.options = field<std::vector<std::string>>(json, "options");
  inputs.stub = field<std::string>(json, "stub");
  for (const nlohmann::json& header : field<nlohmann::json>(json, "headers")) {
    inputs.headers.emplace_back(field<std::string>(header, "name"), field<std::string>(header, "sha256"));
  }
  return inputs;
}

KeyInputs key_inputs(const KernelSource& source, const CompileOptions& options, const Toolkit& toolkit,
                     const TemplateLibrary& templates, int format_version) {
  KeyInputs inputs;
  inputs.format_version = format_version;
  inputs.nvrtc_version = toolkit.nvrtc.str();
  inputs.toolkit_headers = toolkit.header_version;
  inputs.arch = real_arch_name(options.arch);

  std::map<std::string, std::string> portable;  // "-I/usr/local/cuda/include" -> "-I<cuda>/include"
  for (std::size_t i = 0; i < toolkit.include_dirs.size(); ++i) {
    portable.emplace("-I" + toolkit.include_dirs[i].string(),
                     portable_include_option(toolkit, toolkit.include_dirs[i], i));
  }
  for (const std::string& option : options.nvrtc_options(toolkit)) {
    const auto replacement = portable.find(option);
    inputs.options.push_back(replacement == portable.end() ? option : replacement->second);
  }

  inputs.stub = source.render_stub();
  for (const std::string& name : templates.include_closure(source.header)) {
    inputs.headers.emplace_back(name, templates.header_sha256(name));
  }
  return inputs;
}

std::string cache_key(const KeyInputs& inputs) {
  core::Sha256 hash;
  // A tag first, so that no other SHA-256 the project computes can collide with a key by construction.
  hash.update_field("attnplan.cubin-key");
  hash.update_field(std::to_string(inputs.format_version));
  hash.update_field(inputs.nvrtc_version);
  hash.update_field(inputs.toolkit_headers);
  hash.update_field(inputs.arch);
  // Counts before lists: without them, an option moved to the stub's position could hash alike.
  hash.update_field(std::to_string(inputs.options.size()));
  for (const std::string& option : inputs.options) hash.update_field(option);
  hash.update_field(inputs.stub);
  hash.update_field(std::to_string(inputs.headers.size()));
  for (const auto& [name, sha256] : inputs.headers) {
    hash.update_field(name);
    hash.update_field(sha256);
  }
  return hash.hex_digest();
}

std::vector<std::string> key_differences(const KeyInputs& cached, const KeyInputs& wanted) {
  std::vector<std::string> lines;
  auto compare = [&](const char* what, const auto& before, const auto& after) {
    if (before != after) lines.push_back(fmt::format("{}: {} -> {}", what, before, after));
  };
  compare("format version", cached.format_version, wanted.format_version);
  compare("NVRTC version", cached.nvrtc_version, wanted.nvrtc_version);
  compare("toolkit headers", cached.toolkit_headers, wanted.toolkit_headers);
  compare("arch", cached.arch, wanted.arch);
  if (cached.options != wanted.options) {
    lines.push_back(
        fmt::format("options: {} -> {}", fmt::join(cached.options, " "), fmt::join(wanted.options, " ")));
  }
  if (cached.stub != wanted.stub) lines.push_back("stub changed (template arguments, header or kernel)");

  const std::map<std::string, std::string> before(cached.headers.begin(), cached.headers.end());
  const std::map<std::string, std::string> after(wanted.headers.begin(), wanted.headers.end());
  for (const auto& [name, sha256] : after) {
    const auto it = before.find(name);
    if (it == before.end()) {
      lines.push_back(fmt::format("header {} added to the include closure", name));
    } else if (it->second != sha256) {
      lines.push_back(fmt::format("header {} changed", name));
    }
  }
  for (const auto& [name, sha256] : before) {
    if (after.count(name) == 0) lines.push_back(fmt::format("header {} left the include closure", name));
  }
  return lines;
}

}  // namespace attnplan::compiler
