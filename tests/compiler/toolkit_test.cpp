#include <algorithm>
#include <fstream>

#include "compiler/toolkit.hpp"
#include "core/error.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using attnplan::Error;
using attnplan::Stage;
using attnplan::compiler::Toolkit;
using attnplan::compiler::ToolkitCandidate;

namespace {

void touch(const fs::path& path, const std::string& text = "") {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::vector<std::string> origins(const std::vector<ToolkitCandidate>& candidates) {
  std::vector<std::string> names;
  for (const auto& candidate : candidates) names.push_back(candidate.origin);
  return names;
}

}  // namespace

TEST_CASE("locate_in reports every candidate it tried and what was missing", "[toolkit]") {
  attnplan::testing::TempDir dir;
  fs::create_directories(dir / "no-include");
  touch(dir / "no-header/include/cuda.h");
  const std::vector<ToolkitCandidate> candidates{{"explicit root", dir / "missing"},
                                                 {"CUDA_HOME", dir / "no-include"},
                                                 {"CUDA_PATH", dir / "no-header"}};
  try {
    Toolkit::locate_in(candidates);
    FAIL("expected an error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::compile);
    CHECK(error.message().find("cuda_bf16.h") != std::string::npos);
    REQUIRE(error.details().size() == 3);
    CHECK(error.details()[0] == "explicit root: " + (dir / "missing").string() + ": directory not found");
    CHECK(error.details()[1] == "CUDA_HOME: " + (dir / "no-include").string() + ": no include/ directory");
    CHECK(error.details()[2] ==
          "CUDA_PATH: " + (dir / "no-header").string() + ": include/cuda_bf16.h not found");
    CHECK(error.payload().find((dir / "no-header").string()) != std::string::npos);
  }
  CHECK_THROWS_AS(Toolkit::locate_in({}), Error);
}

TEST_CASE("locate_in takes the first root with cuda_bf16.h, and include/cccl when present", "[toolkit]") {
  attnplan::testing::TempDir dir;
  touch(dir / "cuda-12/include/cuda_bf16.h");
  touch(dir / "cuda-12/include/cuda.h", "#pragma once\n#define CUDA_VERSION 12040\n");
  touch(dir / "cuda-13/include/cuda_bf16.h");
  touch(dir / "cuda-13/include/cccl/cuda/std/version");

  const Toolkit old = Toolkit::locate_in({{"bogus", dir / "nothing"}, {"CUDA_HOME", dir / "cuda-12"}});
  CHECK(old.root == dir / "cuda-12");
  CHECK(old.include_dirs == std::vector<fs::path>{dir / "cuda-12/include"});
  CHECK(old.header_version == "12.4");
  CHECK(old.nvrtc.major >= 12);

  const Toolkit current = Toolkit::locate_in({{"CUDA_HOME", dir / "cuda-13"}, {"default", dir / "cuda-12"}});
  CHECK(current.include_dirs == std::vector<fs::path>{dir / "cuda-13/include", dir / "cuda-13/include/cccl"});
  CHECK(current.header_version == "unknown");  // no cuda.h
}

TEST_CASE("an explicit root is the only candidate", "[toolkit]") {
  const auto candidates =
      attnplan::compiler::toolkit_candidates(fs::path("/bogus/cuda"), "/usr/local/cuda", "/x");
  REQUIRE(candidates.size() == 1);
  CHECK(candidates[0].origin == "explicit root");
  CHECK(candidates[0].root == "/bogus/cuda");
  // Even though the fallbacks would find a toolkit on this machine, a wrong explicit root is an error.
  CHECK_THROWS_AS(Toolkit::locate(fs::path("/bogus/cuda"), std::nullopt, std::nullopt), Error);
}

TEST_CASE("candidates come in search order, without duplicates or empty values", "[toolkit]") {
  const auto candidates = attnplan::compiler::toolkit_candidates(std::nullopt, "/opt/cuda-a", "/opt/cuda-b/");
  const auto names = origins(candidates);
  REQUIRE(names.size() >= 3);
  CHECK(names[0] == "CUDA_HOME");
  CHECK(candidates[0].root == "/opt/cuda-a");
  CHECK(names[1] == "CUDA_PATH");
  CHECK(candidates[1].root == "/opt/cuda-b");  // trailing '/' dropped
  // The default comes last, unless libnvrtc's own root already is /usr/local/cuda (as on this machine).
  CHECK(candidates.back().root == "/usr/local/cuda");
  for (std::size_t i = 2; i < names.size(); ++i) {
    const bool last_default = i + 1 == names.size() && names[i] == "default";
    CHECK((last_default || names[i].rfind("libnvrtc (", 0) == 0));
  }

  const auto without_env =
      origins(attnplan::compiler::toolkit_candidates(std::nullopt, std::string(), "/usr/local/cuda"));
  CHECK(without_env.front() == "CUDA_PATH");
  CHECK(std::count(without_env.begin(), without_env.end(), "default") == 0);  // same root as CUDA_PATH
}

TEST_CASE("toolkit roots implied by libnvrtc's directory", "[toolkit]") {
  using attnplan::compiler::roots_for_library_dir;
  CHECK(roots_for_library_dir("/opt/cuda/lib64") == std::vector<fs::path>{"/opt/cuda"});
  CHECK(roots_for_library_dir("/opt/cuda/lib/") == std::vector<fs::path>{"/opt/cuda"});
  CHECK(roots_for_library_dir("/opt/cuda/targets/x86_64-linux/lib") ==
        std::vector<fs::path>{"/opt/cuda/targets/x86_64-linux", "/opt/cuda"});
}

TEST_CASE("the toolkit of this machine is found without the environment", "[toolkit]") {
  const auto library = attnplan::compiler::loaded_nvrtc_library();
  REQUIRE(library.has_value());
  CHECK(library->filename().string().find("nvrtc") != std::string::npos);

  const Toolkit toolkit = Toolkit::locate(std::nullopt, std::nullopt, std::nullopt);
  CHECK(fs::is_regular_file(toolkit.include_dirs.at(0) / "cuda_bf16.h"));
  CHECK(toolkit.nvrtc.major >= 12);
  CHECK(toolkit.nvrtc.str() ==
        std::to_string(toolkit.nvrtc.major) + "." + std::to_string(toolkit.nvrtc.minor));
  CHECK(toolkit.header_version != "unknown");
}
