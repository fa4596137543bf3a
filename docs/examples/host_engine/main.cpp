// The smallest host engine: compile a config's prefill plan through the installed attnplan, and load it
// when this machine has a GPU. Compiling needs neither a GPU nor a driver, so the same binary runs on a
// build host (compile only, which warms the cubin cache) and on a GPU server (compile is then all hits).
//
//   host_engine CONFIG.json      exit 0 ok, 1 bad config, 2 anything else
#include <cstdio>
#include <string>

#include "config/parse.hpp"
#include "core/error.hpp"
#include "driver/device.hpp"
#include "plan/runtime.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: host_engine CONFIG.json\n");
    return 1;
  }
  try {
    // The engine owns one Runtime for its lifetime: the options are read from the environment once
    // (ATTNPLAN_CACHE_DIR, ...), and the cache and compiler are shared by every compile.
    attnplan::Runtime runtime(attnplan::RuntimeOptions::from_environment());
    const attnplan::config::AttentionConfig config = attnplan::config::load_file(argv[1]);
    const attnplan::plan::CompiledPlan compiled = runtime.compile(config);
    std::printf("compiled %zu kernels for %s in %.1f ms\n", compiled.kernels.size(),
                compiled.arch.name().c_str(), compiled.wall_ms);
    for (const attnplan::plan::PlanKernel& kernel : compiled.kernels) {
      std::printf("  %-20s %.12s  %s\n", kernel.name.c_str(), kernel.key.c_str(),
                  kernel.lowered_name.c_str());
    }

    std::string reason;
    if (!attnplan::driver::device_available(&reason)) {
      std::printf("no device (%s): compiled only\n", reason.c_str());
      return 0;
    }
    const attnplan::plan::PrefillPlan plan = runtime.load(compiled);
    std::printf("loaded on device %d\n", runtime.options().device);
    return 0;
  } catch (const attnplan::Error& error) {
    std::fprintf(stderr, "host_engine: %s\n", error.what());
    for (const std::string& detail : error.details()) std::fprintf(stderr, "  %s\n", detail.c_str());
    return error.is_user_error() ? 1 : 2;
  }
}
