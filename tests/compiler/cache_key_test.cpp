#include <sys/wait.h>
#include <unistd.h>

#include <functional>

#include "compiler/cache_key.hpp"
#include "core/error.hpp"
#include "core/sha256.hpp"
#include "support/catch.hpp"
#include "test_kernels.hpp"

using attnplan::compiler::cache_key;
using attnplan::compiler::CompileOptions;
using attnplan::compiler::KernelSource;
using attnplan::compiler::key_inputs;
using attnplan::compiler::KeyInputs;
using attnplan::compiler::TemplateLibrary;
using attnplan::compiler::Toolkit;
using attnplan::testing::kSm80;
using attnplan::testing::kSm90a;

namespace {

// A toolkit that exists only on paper: the key never touches the file system.
Toolkit toolkit_at(const std::string& root) {
  Toolkit toolkit;
  toolkit.root = root;
  toolkit.include_dirs = {root + "/include", root + "/include/cccl"};
  toolkit.nvrtc = {13, 0};
  toolkit.header_version = "13.0";
  return toolkit;
}

// The embedded templates plus one header no kernel includes.
TemplateLibrary library_with(const std::function<void(std::map<std::string, std::string>&)>& edit = {}) {
  auto headers = attnplan::compiler::detail::embedded_template_headers();
  headers["attnplan/unrelated.cuh"] = "#pragma once\n// included by no kernel\n";
  if (edit) edit(headers);
  return TemplateLibrary::from_headers(std::move(headers), "test");
}

struct Case {
  KernelSource source = attnplan::testing::rmsnorm_source(4096, 256, false);
  CompileOptions options{kSm90a};
  Toolkit toolkit = toolkit_at("/opt/cuda-13.0");
  TemplateLibrary templates = library_with();
  int format_version = 1;

  std::string key() const {
    return cache_key(key_inputs(source, options, toolkit, templates, format_version));
  }
};

}  // namespace

TEST_CASE("a key is 64 hex digits and stable", "[cache_key]") {
  const Case base;
  const std::string key = base.key();
  CHECK(key.size() == 64);
  CHECK(key.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(Case{}.key() == key);
}

TEST_CASE("a key does not depend on the process that computes it", "[cache_key]") {
  const Case base;
  const std::string expected = base.key();
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Another process: fresh allocations, another address layout for what it allocates from here on.
    close(fds[0]);
    std::vector<std::string> ballast(1000, std::string(1000, 'x'));
    const std::string key = Case{}.key();
    const ssize_t written = write(fds[1], key.data(), key.size());
    _exit(written == static_cast<ssize_t>(key.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string from_child(64, '\0');
  std::size_t got = 0;
  while (got < from_child.size()) {
    const ssize_t n = read(fds[0], from_child.data() + got, from_child.size() - got);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(from_child == expected);
}

TEST_CASE("every input that can change the cubin changes the key", "[cache_key]") {
  const std::string base = Case{}.key();
  auto differs = [&](const std::function<void(Case&)>& change) {
    Case changed;
    change(changed);
    return changed.key() != base;
  };
  CHECK(differs([](Case& c) { c.options.arch = kSm80; }));
  CHECK(differs([](Case& c) { c.options.arch = {9, 0, false}; }));  // sm_90 vs sm_90a
  CHECK(differs([](Case& c) { c.options.line_info = false; }));
  CHECK(differs([](Case& c) { c.options.extra = {"-DATTNPLAN_EXTRA=1"}; }));
  CHECK(differs([](Case& c) { c.source = attnplan::testing::rmsnorm_source(4096, 256, true); }));
  CHECK(differs([](Case& c) { c.source = attnplan::testing::rmsnorm_source(2048, 256, false); }));
  CHECK(differs([](Case& c) { c.toolkit.nvrtc.minor = 1; }));
  CHECK(differs([](Case& c) { c.toolkit.header_version = "12.9"; }));
  CHECK(differs([](Case& c) { c.format_version = 2; }));
  // One byte of each header in the closure, the stub's own header included.
  for (const char* name : {"attnplan/rmsnorm.cuh", "attnplan/common.cuh", "attnplan/params.h"}) {
    INFO(name);
    CHECK(differs(
        [&](Case& c) { c.templates = library_with([&](auto& headers) { headers[name].back() ^= 1; }); }));
  }
  // A toolkit without include/cccl is a different option list.
  CHECK(differs([](Case& c) { c.toolkit.include_dirs.pop_back(); }));
}

TEST_CASE("inputs that cannot change the cubin leave the key alone", "[cache_key]") {
  const std::string base = Case{}.key();
  auto same = [&](const std::function<void(Case&)>& change) {
    Case changed;
    change(changed);
    return changed.key() == base;
  };
  // Headers outside the closure: kv_store.cuh and a header nobody includes.
  CHECK(same([](Case& c) {
    c.templates = library_with([](auto& h) { h["attnplan/unrelated.cuh"] += "// edit\n"; });
  }));
  CHECK(same([](Case& c) {
    c.templates = library_with([](auto& h) { h["attnplan/kv_store.cuh"] += "// edit\n"; });
  }));
  // The same toolkit installed at another prefix.
  CHECK(same([](Case& c) { c.toolkit = toolkit_at("/home/me/conda/envs/cuda"); }));
  // PTX is read from the same compile; it does not change the cubin.
  CHECK(same([](Case& c) { c.options.keep_ptx = true; }));
  // The spec is recorded in manifests but the stub is what is compiled.
  CHECK(same([](Case& c) { c.source.spec["note"] = "manifest only"; }));
}

TEST_CASE("key inputs name what went into the key", "[cache_key]") {
  const Case base;
  const KeyInputs inputs = key_inputs(base.source, base.options, base.toolkit, base.templates, 1);
  CHECK(inputs.nvrtc_version == "13.0");
  CHECK(inputs.toolkit_headers == "13.0");
  CHECK(inputs.arch == "sm_90a");
  CHECK(inputs.stub == base.source.render_stub());
  CHECK(inputs.options == std::vector<std::string>{"--gpu-architecture=sm_90a", "-std=c++20",
                                                   "-default-device", "--ptxas-options=-v", "--no-cache",
                                                   "-lineinfo", "-I<cuda>/include", "-I<cuda>/include/cccl"});
  REQUIRE(inputs.headers.size() == 6);
  CHECK(inputs.headers[0].first == "attnplan/common.cuh");
  CHECK(inputs.headers[1].first == "attnplan/fp8_activation.cuh");
  CHECK(inputs.headers[2].first == "attnplan/params.h");
  CHECK(inputs.headers[3].first == "attnplan/rmsnorm.cuh");
  CHECK(inputs.headers[4].first == "attnplan/rope.cuh");
  CHECK(inputs.headers[5].first == "attnplan/vector_width.h");
  CHECK(inputs.headers[3].second ==
        attnplan::core::sha256_hex(base.templates.headers().at("attnplan/rmsnorm.cuh")));

  const KeyInputs round_trip = KeyInputs::from_json(nlohmann::json::parse(inputs.to_json().dump()));
  CHECK(round_trip == inputs);
  CHECK(cache_key(round_trip) == cache_key(inputs));
  CHECK_THROWS_AS(KeyInputs::from_json(nlohmann::json{{"format_version", "one"}}), attnplan::Error);
  CHECK_THROWS_AS(KeyInputs::from_json(nlohmann::json::array()), attnplan::Error);
}

TEST_CASE("the key of fixed inputs never changes without a format version bump", "[cache_key]") {
  // Pins the hashing scheme: if this value changes, every cache on disk is silently invalidated (or worse,
  // misread), so change cache::kFormatVersion in the same commit and update the value here.
  KeyInputs inputs;
  inputs.format_version = 1;
  inputs.nvrtc_version = "13.0";
  inputs.toolkit_headers = "13.0";
  inputs.arch = "sm_90a";
  inputs.options = {"--gpu-architecture=sm_90a", "-std=c++20"};
  inputs.stub = "#include \"a.cuh\"\n";
  inputs.headers = {{"a.cuh", attnplan::core::sha256_hex("// a\n")}};
  CHECK(cache_key(inputs) == "49e71a51eae795daa82b06e2ef24c3ac1acaa6b6d2b3bfb0277daf6cfa96fec8");

  // Field boundaries are unambiguous: moving text from one field into its neighbour changes the key.
  KeyInputs shifted = inputs;
  shifted.options = {"--gpu-architecture=sm_90a-std=c++20"};
  CHECK(cache_key(shifted) != cache_key(inputs));
}

TEST_CASE("key differences explain a miss", "[cache_key]") {
  const Case base;
  const KeyInputs cached = key_inputs(base.source, base.options, base.toolkit, base.templates, 1);
  CHECK(attnplan::compiler::key_differences(cached, cached).empty());

  Case changed;
  changed.options.arch = kSm80;
  changed.templates = library_with([](auto& h) { h["attnplan/common.cuh"] += "// edit\n"; });
  const KeyInputs wanted = key_inputs(changed.source, changed.options, changed.toolkit, changed.templates, 1);
  const auto lines = attnplan::compiler::key_differences(cached, wanted);
  CHECK(std::find(lines.begin(), lines.end(), "arch: sm_90a -> sm_80") != lines.end());
  CHECK(std::find(lines.begin(), lines.end(), "header attnplan/common.cuh changed") != lines.end());
  CHECK(std::any_of(lines.begin(), lines.end(),
                    [](const std::string& l) { return l.rfind("options:", 0) == 0; }));
}
