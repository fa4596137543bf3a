#include "compiler/template_library.hpp"

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/sha256.hpp"

namespace attnplan::compiler {

namespace fs = std::filesystem;

namespace {

bool is_template_header(const fs::path& path) {
  const std::string extension = path.extension().string();
  return extension == ".cuh" || extension == ".h";
}

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error(Stage::input, fmt::format("cannot read template header {}", path.string()));
  std::string contents((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) throw Error(Stage::input, fmt::format("cannot read template header {}", path.string()));
  return contents;
}

std::size_t skip_blanks(const std::string& line, std::size_t at) {
  while (at < line.size() && (line[at] == ' ' || line[at] == '\t')) ++at;
  return at;
}

Error not_in_library(const std::string& header, const std::string& origin) {
  return Error(Stage::input,
               fmt::format("template header {} is not in the template library ({})", header, origin));
}

}  // namespace

std::vector<std::string> included_names(const std::string& source) {
  std::vector<std::string> names;
  std::istringstream lines(source);
  std::string line;
  while (std::getline(lines, line)) {
    // `  #  include  "name"` and `#include <name>`: the preprocessor allows blanks around the '#'.
    std::size_t at = skip_blanks(line, 0);
    if (at >= line.size() || line[at] != '#') continue;
    at = skip_blanks(line, at + 1);
    if (line.compare(at, 7, "include") != 0) continue;
    at = skip_blanks(line, at + 7);
    if (at >= line.size() || (line[at] != '"' && line[at] != '<')) continue;
    const char close = line[at] == '"' ? '"' : '>';
    const std::size_t end = line.find(close, at + 1);
    if (end == std::string::npos) continue;
    names.push_back(line.substr(at + 1, end - at - 1));
  }
  return names;
}

TemplateLibrary TemplateLibrary::embedded() {
  return from_headers(detail::embedded_template_headers(), "embedded");
}

TemplateLibrary TemplateLibrary::from_headers(std::map<std::string, std::string> headers,
                                              std::string origin) {
  TemplateLibrary library;
  library.headers_ = std::move(headers);
  library.origin_ = std::move(origin);
  for (const auto& [name, contents] : library.headers_)
    library.sha256_.emplace(name, core::sha256_hex(contents));
  return library;
}

TemplateLibrary TemplateLibrary::from_directory(const fs::path& root) {
  std::error_code error;
  if (!fs::is_directory(root, error)) {
    throw Error(Stage::input,
                fmt::format("template directory {} does not exist or is not a directory", root.string()));
  }
  std::map<std::string, std::string> headers;
  fs::recursive_directory_iterator it(root, error), end;
  for (; !error && it != end; it.increment(error)) {
    std::error_code ignored;  // a dangling symlink is not a header; skip it rather than fail the listing
    if (!it->is_regular_file(ignored) || !is_template_header(it->path())) continue;
    // generic_string: include names use '/' whatever the platform's separator.
    headers.emplace(it->path().lexically_relative(root).generic_string(), read_file(it->path()));
  }
  if (error) {
    throw Error(Stage::input,
                fmt::format("cannot list template directory {}: {}", root.string(), error.message()));
  }
  return from_headers(std::move(headers), root.string());
}

const std::string& TemplateLibrary::header_sha256(const std::string& header) const {
  const auto found = sha256_.find(header);
  if (found == sha256_.end()) throw not_in_library(header, origin_);
  return found->second;
}

std::vector<std::string> TemplateLibrary::include_closure(const std::string& header) const {
  if (!contains(header)) throw not_in_library(header, origin_);
  std::set<std::string> closure{header};
  std::vector<std::string> pending{header};
  while (!pending.empty()) {
    const std::string current = std::move(pending.back());
    pending.pop_back();
    for (std::string& name : included_names(headers_.at(current))) {
      if (contains(name) && closure.insert(name).second) pending.push_back(std::move(name));
    }
  }
  return {closure.begin(), closure.end()};
}

}  // namespace attnplan::compiler
