#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

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
  }
  return "?";
}

void print_table(const plan::CompiledPlan& compiled, const Runtime& runtime) {
  const config::AttentionConfig& config = compiled.config;
  fmt::print("plan    {}hidden {}, heads {}/{}, head_dim {}\n", config.name.empty() ? "" : config.name + ": ",
             config.hidden_size, config.query_heads, config.kv_heads, config.head_dim);
  fmt::print("arch    {}\n", compiled.arch.name());
  fmt::print("cache   {}\n\n", runtime.options().cache_dir.string());
  fmt::print("{:<16} {:<12} {:<6} {:>10} {:>9} {:>10} {:>9}\n", "kernel", "key", "cache", "compile ms",
             "registers", "shared B", "spills B");
  int hits = 0;
  for (const plan::PlanKernel& kernel : compiled.kernels) {
    if (kernel.lookup != cache::Lookup::miss) ++hits;
    fmt::print("{:<16} {:<12} {:<6} {:>10.1f} {:>9} {:>10} {:>9}\n", kernel.name, kernel.key.substr(0, 12),
               lookup_name(kernel.lookup), kernel.compile_ms, kernel.resources.registers,
               kernel.resources.shared_bytes, kernel.resources.spill_bytes());
  }
  fmt::print("\n{} kernels: {} cached, {} compiled, {:.2f} s\n", compiled.kernels.size(), hits,
             compiled.kernels.size() - hits, compiled.wall_ms / 1000.0);
}

void print_json(const plan::CompiledPlan& compiled) {
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
  nlohmann::ordered_json out = {{"arch", compiled.arch.name()}, {"kernels", kernels}};
  fmt::print("{}\n", out.dump(2));
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
  command.synopsis = "compile CONFIG [--arch A] [--cache-dir D] [--json] [--keep-ptx]";
  command.description =
      "Compiles every kernel of the config's prefill plan with NVRTC, or finds it in the cubin cache, and\n"
      "prints one row per kernel. Needs no GPU. The arch is --arch when given, else the config's "
      "target.arch;\n"
      "\"auto\" means the device's arch when a driver and device are present, else sm_90a.";
  command.options = {
      {"--arch", "A", "target arch: auto, sm_80, sm_89, sm_90a, ... (overrides target.arch)"},
      kCacheDirOption,
      {"--json", "", "print {\"arch\", \"kernels\": [...]} on stdout instead of the table"},
      {"--keep-ptx", "", "also store each kernel's PTX in the cache (attnplan cache show KEY --ptx)"},
  };
  command.run = [](const Arguments& args) {
    const config::AttentionConfig config = config::load_file(args.only_positional("CONFIG"));
    RuntimeOptions options = runtime_options(args);
    options.keep_ptx = args.flag("--keep-ptx");
    Runtime runtime(options);
    const plan::CompiledPlan compiled = runtime.compile(config, print_progress);
    if (args.flag("--json")) {
      print_json(compiled);
    } else {
      print_table(compiled, runtime);
    }
    return kExitOk;
  };
  return command;
}

}  // namespace attnplan::cli
