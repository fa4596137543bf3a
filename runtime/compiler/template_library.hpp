// The project's CUDA template headers (templates/), as NVRTC sees them: embedded into the library
// at build time, or read from a source tree for template development.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace attnplan::compiler {

class TemplateLibrary {
 public:
  // The headers embedded at build time.
  static TemplateLibrary embedded();
  // Every *.cuh / *.h under `root` (a checkout's templates/ directory). Throws Error(input) if unreadable.
  static TemplateLibrary from_directory(const std::filesystem::path& root);

  // Include name ("attnplan/rmsnorm.cuh") -> contents.
  const std::map<std::string, std::string>& headers() const { return headers_; }
  // `header` and every project header it includes, transitively (toolkit headers are not listed):
  // the closure whose contents go into the cache key.
  std::vector<std::string> include_closure(const std::string& header) const;
  std::string origin() const { return origin_; }  // "embedded" or the directory

 private:
  std::map<std::string, std::string> headers_;
  std::string origin_;
};

}  // namespace attnplan::compiler
