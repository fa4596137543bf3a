#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "check/layer_check.hpp"
#include "commands.hpp"
#include "config/parse.hpp"
#include "core/error.hpp"
#include "driver/context.hpp"
#include "io/layer_weights.hpp"
#include "io/safetensors.hpp"
#include "plan/runtime.hpp"
#include "runtime_setup.hpp"

namespace attnplan::cli {

Command verify_command() {
  Command command;
  command.name = "verify";
  command.synopsis =
      "verify CONFIG [--tokens N] [--seqs S] [--prefix P] [--mask M] [--seed X] [--weights W [--layer L]] "
      "[--cache-dir D] [--json]";
  command.description =
      "Runs the config's whole prefill plan on the GPU with random weights and inputs, and compares every\n"
      "stage with the double-precision CPU reference (relative L2 error; bf16 operands with fp32\n"
      "accumulation land under 1e-2). The chunk's KV slots are compared too, and every other slot of the\n"
      "page pool must be untouched. Exits 0 when every stage is within tolerance, 2 otherwise. With\n"
      "--weights, the layer's weights (and an fp8 cache's k_scale / v_scale) come from that checkpoint.";
  command.options = {{"--tokens", "N", "chunk tokens over all sequences (default 256)"},
                     {"--seqs", "S", "sequences sharing the chunk (default 1)"},
                     {"--prefix", "P", "tokens already cached per sequence (default 0)"},
                     {"--mask", "M",
                      "causal (default) or bidirectional (one span over each sequence's chunk, which sees "
                      "all of it)"},
                     {"--seed", "X", "random seed (default 1)"},
                     {"--tolerance", "T", "relative L2 bound per stage (default 1e-2)"},
                     {"--weights", "W", "checkpoint with the layer's weights (default: random)"},
                     {"--layer", "L", "tensor name prefix in W, e.g. model.layers.7."},
                     {"--arch", "A", "compile for A instead of the device's arch"},
                     kCacheDirOption,
                     kCachePathOption,
                     kJitOption,
                     {"--json", "", "print the report as JSON"}};
  command.run = [](const Arguments& args) {
    config::AttentionConfig config = config::load_file(args.only_positional("CONFIG"));
    check::Scenario scenario;
    scenario.bidirectional = bidirectional_mask_option(args, config);
    const std::string mask = scenario.bidirectional ? "bidirectional" : "causal";
    scenario.tokens = int_option(args, "--tokens", 256, 1);
    scenario.seqs = int_option(args, "--seqs", 1, 1);
    scenario.prefix = int_option(args, "--prefix", 0, 0);
    scenario.seed = static_cast<std::uint64_t>(int_option(args, "--seed", 1, 0));
    const double tolerance = positive_number_option(args, "--tolerance", 1e-2);
    check::LayerCase layer = check::random_case(config, scenario);
    if (const auto weights_path = args.value("--weights")) {
      // A checkpoint's layer replaces the random weights; its fp8 cache scales replace the config's.
      const io::SafetensorsFile file = io::SafetensorsFile::open(*weights_path);
      layer.weights = io::load_layer_weights(file, config, args.value("--layer").value_or(""));
      if (layer.weights.kv_scales) {
        layer.fp8 =
            reference::KvFp8Scales{layer.weights.kv_scales->k_scale, layer.weights.kv_scales->v_scale};
      }
    } else if (args.value("--layer")) {
      throw UsageError{"--layer needs --weights"};
    }

    Runtime runtime(runtime_options(args));
    driver::Context context(runtime.options().device);
    context.make_current();
    const plan::PrefillPlan plan = runtime.load(runtime.compile(config));
    const check::Report report = check::run_case(plan, layer, tolerance);

    if (args.flag("--json")) {
      nlohmann::ordered_json stages = nlohmann::ordered_json::array();
      for (const auto& stage : report.stages) {
        stages.push_back(
            {{"stage", stage.stage}, {"relative_l2", stage.relative_l2}, {"passed", stage.passed()}});
      }
      nlohmann::ordered_json out = {{"config", config.name},
                                    {"tokens", scenario.tokens},
                                    {"seqs", scenario.seqs},
                                    {"prefix", scenario.prefix},
                                    {"mask", mask},
                                    {"seed", scenario.seed},
                                    {"tolerance", tolerance},
                                    {"stages", stages},
                                    {"unwritten_outputs", report.unwritten},
                                    {"damaged_cache_slots", report.cache_slots_damaged},
                                    {"device_ms", report.device_ms},
                                    {"passed", report.passed()}};
      fmt::print("{}\n", out.dump(2));
    } else {
      fmt::print("{}: {} tokens, {} sequences, prefix {}, {}, seed {}\n\n",
                 config.name.empty() ? "config" : config.name, scenario.tokens, scenario.seqs,
                 scenario.prefix, mask, scenario.seed);
      fmt::print("{:<12} {:>12}  {}\n", "stage", "rel. L2", "");
      for (const auto& stage : report.stages) {
        fmt::print("{:<12} {:>12.3e}  {}\n", stage.stage, stage.relative_l2, stage.passed() ? "ok" : "FAIL");
      }
      fmt::print("\noutputs never written: {}   cache slots damaged: {}   device time {:.3f} ms\n",
                 report.unwritten, report.cache_slots_damaged, report.device_ms);
      fmt::print("{} (tolerance {:.0e})\n", report.passed() ? "PASSED" : "FAILED", tolerance);
    }
    return report.passed() ? kExitOk : kExitFailure;
  };
  return command;
}

}  // namespace attnplan::cli
