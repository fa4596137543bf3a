#include <fmt/format.h>
#include <algorithm>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cache/cubin_cache.hpp"
#include "commands.hpp"
#include "config/parse.hpp"
#include "plan/runtime.hpp"
#include "runtime_setup.hpp"

namespace attnplan::cli {

namespace {

std::string_view lookup_name(cache::Lookup lookup) {
  switch (lookup) {
    case cache::Lookup::hit:
      return "hit";
    case cache::Lookup::miss:
      return "miss";
    case cache::Lookup::memory:
      return "memory";
    case cache::Lookup::prebuilt:
      return "prebuilt";
  }
  return "?";
}

void print_table(const plan::CompiledPlan& compiled, const Runtime& runtime) {
  const config::AttentionConfig& config = compiled.config;
  fmt::print("plan    {}hidden {}, heads {}/{}, head_dim {}\n", config.name.empty() ? "" : config.name + ": ",
             config.hidden_size, config.query_heads, config.kv_heads, config.head_dim);
  fmt::print("arch    {}\n", compiled.arch.name());
  fmt::print("cache   {}\n", runtime.options().cache_dir.string());
  // Only when set, so that the table of an ordinary compile reads as it always has.
  for (const std::filesystem::path& tier : runtime.options().cache_path) {
    fmt::print("tier    {} (read-only)\n", tier.string());
  }
  fmt::print("\n");
  // The name column fits the longest stage name (output_projection_small where a plan has one).
  std::size_t name_width = 17;
  for (const plan::PlanKernel& kernel : compiled.kernels)
    name_width = std::max(name_width, kernel.name.size());
  fmt::print("{:<{}} {:<12} {:<8} {:>10} {:>9} {:>10} {:>9}\n", "kernel", name_width, "key", "cache",
             "compile ms", "registers", "shared B", "spills B");
  int hits = 0;
  for (const plan::PlanKernel& kernel : compiled.kernels) {
    if (kernel.lookup != cache::Lookup::miss) ++hits;
    fmt::print("{:<{}} {:<12} {:<8} {:>10.1f} {:>9} {:>10} {:>9}\n", kernel.name, name_width,
               kernel.key.substr(0, 12), lookup_name(kernel.lookup), kernel.compile_ms,
               kernel.resources.registers, kernel.resources.shared_bytes, kernel.resources.spill_bytes());
  }
  fmt::print("\n{} kernels: {} cached, {} compiled, {:.2f} s\n", compiled.kernels.size(), hits,
             compiled.kernels.size() - hits, compiled.wall_ms / 1000.0);
}

nlohmann::ordered_json plan_json(const plan::CompiledPlan& compiled) {
  nlohmann::ordered_json kernels = nlohmann::ordered_json::array();
  for (const plan::PlanKernel& kernel : compiled.kernels) {
    kernels.push_back({{"name", kernel.name},
                       {"key", kernel.key},
                       {"cache", lookup_name(kernel.lookup)},
                       {"compile_ms", kernel.compile_ms},
                       {"registers", kernel.resources.registers},
                       {"shared_bytes", kernel.resources.shared_bytes},
                       {"spill_bytes", kernel.resources.spill_bytes()}});
  }
  return {{"arch", compiled.arch.name()}, {"kernels", kernels}};
}

// "sm_80,sm_90a" -> each arch; "auto" (or nothing) -> nullopt, the config's or the device's arch.
std::vector<std::optional<config::Arch>> arch_list(const std::optional<std::string>& text) {
  if (!text) return {std::nullopt};
  std::vector<std::optional<config::Arch>> archs;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text->find(',', start);
    archs.push_back(parse_arch_option(text->substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return archs;
}

// Progress on stderr, so that --json output on stdout stays machine-readable.
void print_progress(const CompileProgress& progress) {
  if (progress.started) {
    fmt::print(stderr, "[{}/{} done, {:.1f} s] compiling {}\n", progress.finished, progress.total,
               progress.elapsed_ms / 1000.0, progress.kernel);
  }
}

}  // namespace

Command compile_command() {
  Command command;
  command.name = "compile";
  command.synopsis =
      "compile CONFIG... [--arch A[,A...]] [--cache-dir D] [--cache-path DIRS] [--jit POLICY] [--json] "
      "[--keep-ptx]";
  command.description =
      "Compiles every kernel of the config's prefill plan with NVRTC, or finds it in the cubin cache, and\n"
      "prints one row per kernel. Needs no GPU. The arch is --arch when given, else the config's "
      "target.arch;\n"
      "\"auto\" means the device's arch when a driver and device are present, else sm_90a.\n"
      "Several configs and a comma-separated --arch list compile every (config, arch) pair, e.g. to\n"
      "prebuild a read-only pack for ATTNPLAN_CACHE_PATH; --json then prints an array.";
  command.options = {
      {"--arch", "A",
       "target arch(s): auto, sm_80, sm_89, sm_90a, ..., comma-separated (overrides target.arch)"},
      kCacheDirOption,
      kCachePathOption,
      kJitOption,
      {"--json", "",
       "print {\"arch\", \"kernels\": [...]} on stdout instead of the table (an array of them, each with "
       "\"config\", for several)"},
      {"--keep-ptx", "", "also store each kernel's PTX in the cache (attnplan cache show KEY --ptx)"},
  };
  command.run = [](const Arguments& args) {
    if (args.positional().empty()) throw UsageError{"missing CONFIG"};
    // Every config is loaded (and every arch parsed) before anything compiles: a typo in the last file of
    // a pack build should not cost the minutes spent on the others.
    std::vector<config::AttentionConfig> configs;
    for (const std::string& path : args.positional()) configs.push_back(config::load_file(path));
    const std::vector<std::optional<config::Arch>> archs = arch_list(args.value("--arch"));
    RuntimeOptions options = runtime_options_except_arch(args);
    options.keep_ptx = args.flag("--keep-ptx");

    const bool several = configs.size() > 1 || archs.size() > 1;
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (std::size_t arch_index = 0; arch_index < archs.size(); ++arch_index) {
      options.arch = archs[arch_index];
      // One runtime per arch: kernels shared by several configs are compiled once (and reported as
      // "memory" after the first).
      Runtime runtime(options);
      for (std::size_t index = 0; index < configs.size(); ++index) {
        const plan::CompiledPlan compiled = runtime.compile(configs[index], print_progress);
        if (args.flag("--json")) {
          nlohmann::ordered_json result = plan_json(compiled);
          if (several) {
            nlohmann::ordered_json labelled = {{"config", args.positional()[index]}};
            labelled.update(result);
            results.push_back(std::move(labelled));
          } else {
            results.push_back(std::move(result));
          }
        } else {
          if (index > 0 || arch_index > 0) fmt::print("\n");
          print_table(compiled, runtime);
        }
      }
    }
    // One (config, arch): the single object the format has always had; several: an array of them.
    if (args.flag("--json")) fmt::print("{}\n", several ? results.dump(2) : results.front().dump(2));
    return kExitOk;
  };
  return command;
}

}  // namespace attnplan::cli
