// The project's CUDA template headers (templates/), as NVRTC sees them: embedded into the library
// at build time, or read from a source tree for template development.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace attnplan::compiler {

namespace detail {
// Generated at build time by cmake/GenerateEmbeddedTemplates.cmake: include name -> contents.
const std::map<std::string, std::string>& embedded_template_headers();
}  // namespace detail

class TemplateLibrary {
 public:
  // The headers embedded at build time.
  static TemplateLibrary embedded();
  // Every *.cuh / *.h under `root` (a checkout's templates/ directory), named by their path relative to
  // `root` with '/' separators. Throws Error(input) if `root` is not a readable directory.
  static TemplateLibrary from_directory(const std::filesystem::path& root);
  // Headers given in memory (tests, tools that generate templates); `origin` says where they came from.
  static TemplateLibrary from_headers(std::map<std::string, std::string> headers, std::string origin);

  // Include name ("attnplan/rmsnorm.cuh") -> contents.
  const std::map<std::string, std::string>& headers() const { return headers_; }
  bool contains(const std::string& name) const { return headers_.count(name) != 0; }

  // `header` and every library header it includes, transitively, sorted: the closure whose contents go
  // into the cache key. Follows `#include "name"` and `#include <name>` alike when `name` is a library
  // header, because NVRTC resolves both forms against its in-memory headers by exact name (never
  // relative to the including file). Toolkit and unknown names are skipped. Over-approximates on
  // purpose (an include inside `#if 0` or a comment still counts): an extra header only makes the key
  // more specific, a missing one would make it stale. Throws Error(input) if `header` is not in the library.
  std::vector<std::string> include_closure(const std::string& header) const;

  // SHA-256 (hex) of a header's contents, for the cache key. Hashed once when the library is built:
  // every compile call keys every kernel, and a kernel's closure repeats the same few headers. The
  // library is immutable afterwards, so concurrent callers (Runtime's threads) only read.
  // Throws Error(input) if `header` is not in the library.
  const std::string& header_sha256(const std::string& header) const;

  std::string origin() const { return origin_; }  // "embedded" or the directory

 private:
  std::map<std::string, std::string> headers_;
  std::map<std::string, std::string> sha256_;  // include name -> SHA-256 hex of headers_[name]
  std::string origin_;
};

// The header names of every `#include` directive in `source`, in order, quotes and brackets stripped.
std::vector<std::string> included_names(const std::string& source);

}  // namespace attnplan::compiler
