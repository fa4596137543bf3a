// RuntimeOptions::jit end to end with real NVRTC compiles into temporary caches (no GPU): off never
// compiles, read_only never writes, rebuild always compiles.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "config/parse.hpp"
#include "plan/runtime.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;

namespace {

config::AttentionConfig llama() {
  return config::load_file(std::filesystem::path(ATTNPLAN_SOURCE_DIR) / "plans" / "llama-3.1-8b.json");
}

RuntimeOptions options_for(const std::filesystem::path& cache_dir, JitPolicy jit,
                           std::vector<std::filesystem::path> cache_path = {}) {
  RuntimeOptions options;
  options.cache_dir = cache_dir;
  options.cache_path = std::move(cache_path);
  options.jit = jit;
  options.arch = config::parse_arch("sm_90a");
  return options;
}

// Path -> (size, mtime) of every file under `root`; empty when it does not exist.
std::map<std::filesystem::path, std::pair<std::uintmax_t, std::filesystem::file_time_type>> snapshot(
    const std::filesystem::path& root) {
  std::map<std::filesystem::path, std::pair<std::uintmax_t, std::filesystem::file_time_type>> files;
  if (!std::filesystem::exists(root)) return files;
  for (const auto& item : std::filesystem::recursive_directory_iterator(root)) {
    if (item.is_regular_file()) files[item.path()] = {item.file_size(), item.last_write_time()};
  }
  return files;
}

void quiet(const std::string&) {}

}  // namespace

TEST_CASE("ATTNPLAN_JIT and ATTNPLAN_CACHE_PATH are parsed once, strictly", "[plan][jit]") {
  CHECK(parse_jit_policy("on") == JitPolicy::on);
  CHECK(parse_jit_policy("off") == JitPolicy::off);
  CHECK(parse_jit_policy("read-only") == JitPolicy::read_only);
  CHECK(parse_jit_policy("rebuild") == JitPolicy::rebuild);
  CHECK_FALSE(parse_jit_policy("read_only"));
  CHECK_FALSE(parse_jit_policy("OFF"));
  CHECK(parse_cache_path("/a::b:") == std::vector<std::filesystem::path>{"/a", "b"});
  CHECK(parse_cache_path("").empty());

  ::setenv("ATTNPLAN_JIT", "never", 1);
  ::setenv("ATTNPLAN_CACHE_PATH", "/packs/a:/packs/b", 1);
  const Error bad = expect_error([] { RuntimeOptions::from_environment(); });
  CHECK(bad.stage() == Stage::input);
  CHECK(contains(bad.message(), "ATTNPLAN_JIT=never"));
  ::setenv("ATTNPLAN_JIT", "read-only", 1);
  const RuntimeOptions options = RuntimeOptions::from_environment();
  CHECK(options.jit == JitPolicy::read_only);
  CHECK(options.cache_path == std::vector<std::filesystem::path>{"/packs/a", "/packs/b"});
  ::unsetenv("ATTNPLAN_JIT");
  ::unsetenv("ATTNPLAN_CACHE_PATH");
}

TEST_CASE("JIT policies: off, read-only and rebuild", "[plan][jit][nvrtc]") {
  testing::TempDir dir;
  const config::AttentionConfig config = llama();

  // off over an empty cache: nothing is compiled, and the error says what is missing and where it looked.
  {
    Runtime runtime(options_for(dir / "empty", JitPolicy::off, {dir / "no-pack"}), quiet);
    const std::vector<PlannedKey> keys = runtime.plan_keys(config);
    REQUIRE(keys.size() == 8);  // sm_90a: both projections have a small-M specialization
    const Error missing = expect_error([&] { runtime.compile(config); });
    CHECK(missing.stage() == Stage::compile);
    CHECK(contains(missing.message(), keys.front().name));
    CHECK(contains(missing.message(), keys.front().key));
    std::string details;
    for (const std::string& line : missing.details()) details += line + "\n";
    CHECK(contains(details, (dir / "no-pack").string()));
    CHECK(contains(details, (dir / "empty").string()));
    CHECK(runtime.cache().list().empty());
    // Not even an empty lock file is left for the kernel that was looked up and not found.
    for (const auto& item : std::filesystem::recursive_directory_iterator(dir / "empty")) {
      INFO(item.path().string());
      CHECK_FALSE(item.is_regular_file());
    }
  }

  // A pack built the ordinary way.
  Runtime builder(options_for(dir / "pack", JitPolicy::on), quiet);
  const plan::CompiledPlan built = builder.compile(config);
  for (const plan::PlanKernel& kernel : built.kernels) CHECK(kernel.lookup == cache::Lookup::miss);

  // off with everything in a read-only tier: works, compiles nothing, writes nothing into its own dir.
  {
    const auto pack_before = snapshot(dir / "pack");
    std::vector<CompileProgress> progress;
    Runtime runtime(options_for(dir / "writable", JitPolicy::off, {dir / "pack"}), quiet);
    const plan::CompiledPlan compiled =
        runtime.compile(config, [&](const CompileProgress& p) { progress.push_back(p); });
    for (std::size_t i = 0; i < compiled.kernels.size(); ++i) {
      INFO(compiled.kernels[i].name);
      CHECK(compiled.kernels[i].lookup == cache::Lookup::prebuilt);
      CHECK(compiled.kernels[i].tier == dir / "pack");
      CHECK(compiled.kernels[i].compile_ms == 0);
      CHECK(compiled.kernels[i].key == built.kernels[i].key);
      CHECK(compiled.kernels[i].entry->cubin == built.kernels[i].entry->cubin);
      CHECK_FALSE(compiled.kernels[i].lowered_name.empty());
    }
    for (const CompileProgress& p : progress) CHECK_FALSE(p.started);  // no kernel started compiling
    CHECK(runtime.cache().list().empty());
    CHECK(snapshot(dir / "pack") == pack_before);
  }

  // read_only over the pack with one entry gone: the hits and the one miss touch nothing on disk.
  {
    std::filesystem::remove(builder.cache().manifest_path(built.kernels.back().key));
    std::filesystem::remove(builder.cache().cubin_path(built.kernels.back().key));
    const auto before = snapshot(dir / "pack");
    Runtime runtime(options_for(dir / "pack", JitPolicy::read_only), quiet);
    const plan::CompiledPlan compiled = runtime.compile(config);
    for (std::size_t i = 0; i + 1 < compiled.kernels.size(); ++i) {
      CHECK(compiled.kernels[i].lookup == cache::Lookup::hit);
    }
    CHECK(compiled.kernels.back().lookup == cache::Lookup::miss);
    CHECK(compiled.kernels.back().entry->cubin == built.kernels.back().entry->cubin);
    CHECK(snapshot(dir / "pack") == before);

    Runtime fresh(options_for(dir / "never-created", JitPolicy::read_only), quiet);
    CHECK(fresh.plan_keys(config).size() == 8);
    CHECK_FALSE(std::filesystem::exists(dir / "never-created"));
  }

  // rebuild: every kernel is compiled again although the pack has (most of) them, and published.
  {
    Runtime runtime(options_for(dir / "pack", JitPolicy::rebuild, {dir / "pack"}), quiet);
    const plan::CompiledPlan compiled = runtime.compile(config);
    for (const plan::PlanKernel& kernel : compiled.kernels) {
      INFO(kernel.name);
      CHECK(kernel.lookup == cache::Lookup::miss);
      CHECK(kernel.compile_ms > 0);
      CHECK(std::filesystem::exists(runtime.cache().manifest_path(kernel.key)));
    }
  }
}
