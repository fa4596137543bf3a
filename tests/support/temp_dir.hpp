// A fresh directory under the system temp dir, removed (recursively) when the object dies.
#pragma once

#include <filesystem>
#include <string>

namespace attnplan::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "attnplan-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace attnplan::testing
