// Runtime::compile end to end on this machine: real NVRTC compiles into a temporary cache, no GPU.
#include <filesystem>
#include <set>

#include "config/parse.hpp"
#include "core/error.hpp"
#include "plan/gemm_fp8.hpp"
#include "plan/gemm_spec.hpp"
#include "plan/runtime.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;

namespace {

std::filesystem::path plans_dir() {
  return std::filesystem::path(ATTNPLAN_SOURCE_DIR) / "plans";
}

RuntimeOptions options_for(const std::filesystem::path& cache_dir, const std::string& arch) {
  RuntimeOptions options;
  options.cache_dir = cache_dir;
  options.arch = config::parse_arch(arch);
  return options;
}

bool is_elf(const std::vector<std::uint8_t>& bytes) {
  return bytes.size() > 4 && bytes[0] == 0x7f && bytes[1] == 'E' && bytes[2] == 'L' && bytes[3] == 'F';
}

}  // namespace

TEST_CASE("an arch the kernels cannot target is an input error that names where it came from",
          "[plan][arch]") {
  testing::TempDir dir;
  config::AttentionConfig config = config::load_file(plans_dir() / "llama-3.1-8b.json");
  const auto refusal = [&](Runtime& runtime) -> std::string {
    try {
      runtime.compile(config);
    } catch (const Error& error) {
      CHECK(error.is_user_error());
      return error.message();
    }
    FAIL("compiled for an unsupported arch");
    return "";
  };
  Runtime options_arch(options_for(dir.path(), "sm_75"));
  CHECK(refusal(options_arch) ==
        "RuntimeOptions::arch: sm_75 is not supported: the kernels need sm_80 or newer (cp.async, bf16 mma)");
  CHECK_THROWS_AS(options_arch.plan_keys(config), Error);
  // A config built in code, never validated, with an arch of its own.
  config.target.arch = config::parse_arch("sm_80a");
  Runtime config_arch(options_for(dir.path(), "auto"));
  CHECK(refusal(config_arch) ==
        "/target/arch: sm_80a does not exist: architecture-specific (\"a\") variants start at sm_90a");
  // Nothing was compiled, so nothing was cached.
  for (const auto& file : std::filesystem::recursive_directory_iterator(dir.path())) {
    INFO(file.path());
    CHECK(file.path().extension() != ".cubin");
  }
}

TEST_CASE("a cold compile misses, a new runtime hits on disk, the same runtime hits in memory",
          "[plan][nvrtc]") {
  testing::TempDir dir;
  const config::AttentionConfig config = config::load_file(plans_dir() / "llama-3.1-8b.json");
  std::vector<std::string> warnings;
  auto collect = [&](const std::string& message) { warnings.push_back(message); };

  Runtime cold(options_for(dir.path(), "sm_90a"), collect);
  std::vector<CompileProgress> progress;
  const plan::CompiledPlan first =
      cold.compile(config, [&](const CompileProgress& p) { progress.push_back(p); });
  REQUIRE(first.kernels.size() == 8);  // sm_90a: both projections have a small-M specialization
  for (const plan::PlanKernel& kernel : first.kernels) {
    INFO(kernel.name);
    CHECK(kernel.lookup == cache::Lookup::miss);
    CHECK(kernel.key.size() == 64);
    CHECK(kernel.compile_ms > 0);
    CHECK(kernel.resources.registers > 0);
    CHECK(kernel.resources.spill_bytes() == 0);
    CHECK(kernel.lowered_name.rfind("_Z", 0) == 0);
    CHECK(is_elf(kernel.entry->cubin));
  }
  // One "started" and one "finished" report per compiled kernel; the last says all are done.
  REQUIRE(progress.size() == 16);
  CHECK(progress.back().finished == 8);
  CHECK(progress.back().total == 8);

  const plan::CompiledPlan again = cold.compile(config);
  for (const plan::PlanKernel& kernel : again.kernels) CHECK(kernel.lookup == cache::Lookup::memory);

  Runtime warm(options_for(dir.path(), "sm_90a"), collect);
  const plan::CompiledPlan second = warm.compile(config);
  for (std::size_t i = 0; i < second.kernels.size(); ++i) {
    CHECK(second.kernels[i].lookup == cache::Lookup::hit);
    CHECK(second.kernels[i].key == first.kernels[i].key);
    CHECK(second.kernels[i].compile_ms == 0);
    CHECK(second.kernels[i].resources.registers == first.kernels[i].resources.registers);
    CHECK(second.kernels[i].entry->cubin == first.kernels[i].entry->cubin);
  }
  CHECK(warnings.empty());
}

TEST_CASE("every plan in plans/ compiles for sm_80 and sm_90a with no spills", "[plan][nvrtc][plans]") {
  testing::TempDir dir;
  for (const std::string arch : {"sm_80", "sm_90a"}) {
    Runtime runtime(options_for(dir.path(), arch), [](const std::string&) {});
    std::set<std::string> keys;
    for (const auto& file : std::filesystem::directory_iterator(plans_dir())) {
      if (file.path().extension() != ".json") continue;
      INFO(file.path().filename().string() << " for " << arch);
      const config::AttentionConfig config = config::load_file(file.path());
      // Plans whose projections have no kernel on this arch (fp8 activations off sm_90a) are refused by
      // plan_kernels (fp8_activation_plan_test); they are in plans/ for the loader and the reference.
      const auto has_kernel = [&](const config::WeightEncoding& encoding) {
        return plan::uses_fp8_activations(encoding)
                   ? plan::fp8_activation_gemm_available(*config::parse_arch(arch))
                   : plan::gemm_supports(encoding);
      };
      if (!has_kernel(config.projection.qkv) || !has_kernel(config.projection.output)) continue;
      const plan::CompiledPlan compiled = runtime.compile(config);
      CHECK(compiled.arch.name() == arch);
      for (const plan::PlanKernel& kernel : compiled.kernels) {
        INFO(kernel.name);
        CHECK(is_elf(kernel.entry->cubin));
        CHECK(kernel.resources.registers > 0);
        CHECK(kernel.resources.spill_bytes() == 0);
        CHECK(kernel.resources.stack_bytes == 0);
        CHECK(kernel.entry->manifest.value("arch", "") == arch);
        keys.insert(kernel.key);
      }
    }
    CHECK(keys.size() >= 4);
  }
}

TEST_CASE("the arch is the option, else the config's target, else sm_90a without a device", "[plan]") {
  testing::TempDir dir;
  config::AttentionConfig config = config::load_file(plans_dir() / "llama-3.1-8b.json");
  RuntimeOptions options;
  options.cache_dir = dir.path();
  Runtime runtime(options, [](const std::string&) {});
  config.target.arch = config::parse_arch("sm_80");
  CHECK(runtime.resolve_arch(config).name() == "sm_80");
  options.arch = config::parse_arch("sm_89");
  Runtime overriding(options, [](const std::string&) {});
  CHECK(overriding.resolve_arch(config).name() == "sm_89");
}
