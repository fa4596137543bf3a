// attnplan bench: times each stage of a config's prefill plan on the GPU with CUDA events and reports ms,
// TFLOP/s (compute stages) and GB/s (memory-bound stages), plus the whole layer, eager and as a CUDA graph.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "check/attention_trace.hpp"
#include "check/bench_counts.hpp"
#include "check/device_batch.hpp"
#include "check/device_weights.hpp"
#include "check/layer_check.hpp"
#include "check/spot_check.hpp"
#include "commands.hpp"
#include "config/parse.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "driver/context.hpp"
#include "driver/cuda_api.hpp"
#include "driver/device.hpp"
#include "driver/event.hpp"
#include "driver/memory.hpp"
#include "driver/stream.hpp"
#include "plan/runtime.hpp"
#include "runtime_setup.hpp"

namespace attnplan::cli {

namespace {

// The H200 holds its top clock for only the first ~35 ms of back-to-back work; then its power limit
// (clock-limit reason "software power cap") takes the long kernels 10-20% slower, a step visible in
// runs_ms (docs/performance.md, "Sustained clocks"). Timing from an idle GPU mixed the two states
// within one row's runs, so medians flipped between them from run to run. Each timed pass now starts
// after this much work, where a serving engine's prefills run, and so do the peers' (bench_peers.py).
constexpr int kDefaultWarmupMs = 300;

// What the command line asks for, checked against the config before any device work.
struct BenchRequest {
  config::AttentionConfig config;
  std::vector<check::SequenceShape> sequences;
  int tokens = 0;
  int prefix = 0;
  bool bidirectional = false;  // one span over each sequence's whole chunk: non-causal attention
  int iterations = 0;
  int warmup = 0;
  double warmup_ms = 0;  // and at least this much back-to-back work before each timed pass
  std::uint64_t seed = 1;
};

BenchRequest parse_request(const Arguments& args) {
  BenchRequest request;
  request.config = config::load_file(args.only_positional("CONFIG"));
  config::AttentionConfig& config = request.config;
  if (args.value("--block-size")) {
    config.kv_cache.block_size = int_option(args, "--block-size", 0, 1);
    config::check(config, "--block-size");
  }
  request.bidirectional = bidirectional_mask_option(args, config);
  request.tokens = int_option(args, "--tokens", std::min(4096, config.max_tokens), 1);
  if (request.tokens > config.max_tokens) {
    throw Error(Stage::input,
                fmt::format("--tokens {}: more than the config's max_tokens {} (raise max_tokens "
                            "in the config)",
                            request.tokens, config.max_tokens));
  }
  const int seqs = int_option(args, "--seqs", 1, 1);
  request.prefix = int_option(args, "--prefix", 0, 0);
  if (request.bidirectional && request.prefix > 0) {
    throw Error(Stage::input,
                "--mask bidirectional: needs --prefix 0 (a span may not cover the cached prefix "
                "and the chunk at once)");
  }
  for (int length : check::varlen_split(request.tokens, seqs)) {
    check::SequenceShape sequence{request.prefix, length, {}};
    if (request.bidirectional) sequence.spans.push_back({0, length});
    request.sequences.push_back(sequence);
  }
  request.iterations = int_option(args, "--iterations", 50, 1);
  request.warmup = int_option(args, "--warmup", 5, 0);
  request.warmup_ms = int_option(args, "--warmup-ms", kDefaultWarmupMs, 0);
  request.seed = static_cast<std::uint64_t>(int_option(args, "--seed", 1, 0));
  return request;
}

// One rotation set: its own copy of everything execute() reads or writes, so runs that follow each
// other touch different memory.
struct DeviceSet {
  driver::DeviceBuffer input, output, key_cache, value_cache, workspace;
  check::DeviceWeights weights;
  plan::ExecuteArgs args;
  std::size_t bytes() const {
    std::size_t total = input.size_bytes() + output.size_bytes() + key_cache.size_bytes() +
                        value_cache.size_bytes() + workspace.size_bytes();
    for (const auto& buffer : weights.buffers) total += buffer.size_bytes();
    return total;
  }
};

// One rotation set on the device: the case's input and weights, its KV pools as `pools` holds them (an fp8
// cache's codes, as the fp8 store would have written them, quantized once for all the sets), an output and
// a workspace.
DeviceSet upload_set(const check::LayerCase& layer, const check::InitialKvPools& pools,
                     const plan::PrefillPlan& plan, const check::DeviceBatch& batch) {
  DeviceSet set;
  const std::size_t tokens = static_cast<std::size_t>(layer.num_tokens());
  set.input = driver::DeviceBuffer::from_host(layer.input);
  set.output = driver::DeviceBuffer(tokens * static_cast<std::size_t>(layer.config.hidden_size) * 2);
  set.key_cache = driver::DeviceBuffer::from_host(pools.key());
  set.value_cache = driver::DeviceBuffer::from_host(pools.value());
  set.workspace = driver::DeviceBuffer(plan.workspace_bytes(layer.num_tokens()));
  set.weights = check::upload_weights(layer.config, layer.weights);
  plan::ExecuteArgs& args = set.args;
  args.input = set.input.data<const void>();
  args.output = set.output.data<void>();
  args.weights = set.weights.view;
  args.cache = {set.key_cache.data<void>(), set.value_cache.data<void>(), layer.num_blocks};
  if (layer.fp8) {
    args.cache.k_scale = layer.fp8->k_scale;
    args.cache.v_scale = layer.fp8->v_scale;
  }
  args.batch = batch.description();
  args.workspace = set.workspace.data<void>();
  args.workspace_bytes = set.workspace.size_bytes();
  return set;
}

struct Row {
  std::string name;    // a stage's name, "stages_total", "layer" or "layer_graph"
  std::string kernel;  // the plan's kernel for a stage
  check::Spread ms;
  double flops = 0;
  double bytes = 0;
  std::vector<double> runs_ms;  // each timed run, in the order they ran (drift shows up here)
};

Row timed_row(std::string name, std::string kernel, std::vector<double> runs_ms, double flops, double bytes) {
  Row row{std::move(name), std::move(kernel), check::spread(runs_ms), flops, bytes, {}};
  row.runs_ms = std::move(runs_ms);
  return row;
}

// Enqueues enqueue(0), enqueue(1), ... until at least `runs` of them and at least `ms` of GPU time have
// run back to back; timed in batches, each sized from the time per run so far.
void warm_up(const std::function<void(int)>& enqueue, int runs, double ms, CUstream stream) {
  int done = 0;
  double elapsed = 0;
  int batch = runs > 0 || ms > 0 ? 1 : 0;  // the first run alone: its time sizes the next batch
  while (batch > 0) {
    driver::Event start = driver::Event::create(), stop = driver::Event::create();
    start.record(stream);
    for (int run = 0; run < batch; ++run) enqueue(done + run);
    stop.record(stream);
    stop.synchronize();
    done += batch;
    const double took = driver::elapsed_ms(start, stop);
    elapsed += took;
    // A batch too short for the events to time (they resolve ~0.5 us) cannot size the next one: the run
    // count alone then bounds the warm-up.
    const double wanted = took > 0 && elapsed < ms ? std::ceil((ms - elapsed) / (elapsed / done)) : 0;
    const int for_time = static_cast<int>(std::min(wanted, 1e6));  // a batch at a time, in int range
    batch = std::max(runs - done, for_time);
  }
}

std::vector<Row> measure(const plan::PrefillPlan& plan, const std::vector<DeviceSet>& sets,
                         const std::vector<check::StageWork>& work, int iterations, int warmup,
                         double warmup_ms) {
  const driver::CudaApi& cu = driver::api();
  driver::Stream stream = driver::Stream::create();
  auto set_of = [&](int run) -> const DeviceSet& {
    return sets[static_cast<std::size_t>(run) % sets.size()];
  };
  // Each warm-up ends in a synchronize: without a run queued ahead, the GPU would sit idle while the host
  // enqueues the first timed run, and that wait would land in its first stage (the `max` column read the
  // input norm at 5x its median and the layer 25% above its). One untimed run, on the set before set 0
  // in the rotation (so run 0 does not find its inputs in L2), keeps the GPU busy meanwhile.
  auto lead_in = [&]() { plan.execute(set_of(static_cast<int>(sets.size()) - 1).args, stream.handle()); };
  warm_up([&](int run) { plan.execute(set_of(run).args, stream.handle()); }, warmup, warmup_ms,
          stream.handle());
  lead_in();

  // Per stage: an event before the first stage and one after each (the observer runs right after a
  // stage is enqueued). Every run is enqueued before any is read, so the device never waits on the host.
  // Stages are matched to their counts by kind: a plan that fuses a stage away (say RoPE into the QKV
  // epilogue) just reports fewer rows.
  std::vector<std::vector<driver::Event>> marks(static_cast<std::size_t>(iterations));
  std::vector<plan::StageKind> stages;  // in the order the plan enqueues them (the first run's)
  for (int run = 0; run < iterations; ++run) {
    std::vector<driver::Event>& run_marks = marks[static_cast<std::size_t>(run)];
    run_marks.push_back(driver::Event::create());
    run_marks.front().record(stream.handle());
    std::size_t seen = 0;
    // Observation::timing: the stages run as unobserved (no results written only for an observer to read).
    plan.execute(
        set_of(run).args, stream.handle(),
        [&](plan::StageKind stage, const plan::WorkspaceLayout&) {
          if (run == 0) stages.push_back(stage);
          if (seen >= stages.size() || stages[seen] != stage) {
            throw Error(Stage::internal, fmt::format("bench: stage {} enqueued out of the first run's order",
                                                     plan::to_string(stage)));
          }
          ++seen;
          run_marks.push_back(driver::Event::create());
          run_marks.back().record(stream.handle());
        },
        plan::Observation::timing);
  }
  stream.synchronize();
  std::vector<Row> rows;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    std::vector<double> times;
    for (const auto& run_marks : marks) times.push_back(driver::elapsed_ms(run_marks[s], run_marks[s + 1]));
    double stage_flops = 0, stage_bytes = 0;
    for (const check::StageWork& counted : work) {
      if (counted.stage == stages[s]) {
        stage_flops = counted.flops;
        stage_bytes = counted.bytes;
      }
    }
    // The kernels this chunk ran for the stage: a projection's small specialization or dequantized path
    // shows. The attention stage's kernel depends on the batch, not only on the token count: its
    // short-launch or split-tail specialization shows.
    const int num_tokens = sets.front().args.batch.num_tokens;
    std::string kernels;
    if (stages[s] == plan::StageKind::attention) {
      kernels = plan::attention_kernel_name(plan.attention_variant(sets.front().args.batch));
    } else {
      for (const std::string& name : plan.stage_kernels(stages[s], num_tokens))
        kernels += (kernels.empty() ? "" : "+") + name;
    }
    // A q|k|v launch whose tiles hold whole heads applies the q/k/v norms and RoPE in its epilogue: the
    // stage's time then includes the postprocess, which has no stage of its own (a peer's GEMM does less).
    if (stages[s] == plan::StageKind::qkv_projection && plan.qkv_postprocess_fused(num_tokens))
      kernels += " (qkv_postprocess in its epilogue)";
    rows.push_back(timed_row(std::string(plan::to_string(stages[s])), std::move(kernels), std::move(times),
                             stage_flops, stage_bytes));
  }
  double flops = 0, bytes = 0;
  for (const auto& stage : work) {
    flops += stage.flops;
    bytes += stage.bytes;
  }
  // The same runs end to end (first mark to last): the layer as the stage pass saw it, to set beside the
  // "layer" row below, which times the same execute() without the observer. Session 12's tables had the
  // stages summing to 13% less than "layer": this row and runs_ms showed it was the power cap engaging
  // between the passes (kDefaultWarmupMs above), not a cost between stages.
  std::vector<double> totals;
  for (const auto& run_marks : marks)
    totals.push_back(driver::elapsed_ms(run_marks.front(), run_marks.back()));
  rows.push_back(timed_row("stages_total", "", std::move(totals), flops, bytes));

  // The whole layer, two ways in one pass: events around each execute() (no observer) and around a replay
  // of that copy's execute() captured once as a CUDA graph, the two runs alternating. Timed in two passes
  // (until session 32), the graph's always ran second, on a GPU that had been at its power cap for longer,
  // and read up to 5% slower than the direct pass; alternated, both see the same clocks.
  std::vector<CUgraph> graphs;
  std::vector<CUgraphExec> execs;
  auto release_graphs = [&]() noexcept {
    for (CUgraphExec exec : execs) cu.cuGraphExecDestroy(exec);
    for (CUgraph graph : graphs) cu.cuGraphDestroy(graph);
  };
  try {
    for (const DeviceSet& set : sets) {
      CUgraph graph = nullptr;
      CUgraphExec exec = nullptr;
      driver::check(cu.cuStreamBeginCapture(stream.handle(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                    "cuStreamBeginCapture");
      try {
        plan.execute(set.args, stream.handle());
      } catch (...) {
        cu.cuStreamEndCapture(stream.handle(), &graph);
        if (graph != nullptr) cu.cuGraphDestroy(graph);
        throw;
      }
      driver::check(cu.cuStreamEndCapture(stream.handle(), &graph), "cuStreamEndCapture");
      graphs.push_back(graph);
      driver::check(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiateWithFlags");
      execs.push_back(exec);
    }
    // Run r: direct when r is even, the graph when odd, on copy r (mod the copies), so that no run reads
    // the copy the run before it left in L2 (with two copies, each way keeps its own).
    auto enqueue = [&](int run) {
      if (run % 2 == 0) {
        plan.execute(set_of(run).args, stream.handle());
      } else {
        driver::check(cu.cuGraphLaunch(execs[std::size_t(run) % execs.size()], stream.handle()),
                      "cuGraphLaunch");
      }
    };
    warm_up(enqueue, 2 * warmup, warmup_ms, stream.handle());
    std::vector<driver::Event> bounds;
    for (int run = 0; run <= 2 * iterations; ++run) bounds.push_back(driver::Event::create());
    lead_in();  // after the events' creation, so that the host has only the runs left to enqueue
    bounds.front().record(stream.handle());
    for (int run = 0; run < 2 * iterations; ++run) {
      enqueue(run);
      bounds[std::size_t(run) + 1].record(stream.handle());
    }
    stream.synchronize();
    std::vector<double> direct, replayed;
    for (int run = 0; run < 2 * iterations; ++run) {
      const double ms = driver::elapsed_ms(bounds[std::size_t(run)], bounds[std::size_t(run) + 1]);
      (run % 2 == 0 ? direct : replayed).push_back(ms);
    }
    rows.push_back(timed_row("layer", "", std::move(direct), flops, bytes));
    rows.push_back(timed_row("layer_graph", "", std::move(replayed), flops, bytes));
  } catch (...) {
    stream.synchronize();
    release_graphs();
    throw;
  }
  release_graphs();
  return rows;
}

// Token rows the spot check compares (check::spot_rows): each sequence's first and last, then spread evenly.
// About a second of the reference's time at 16k tokens and D 256.
constexpr int kSpotRows = 16;

std::string describe(const check::SpotCheck& spot) {
  std::string text =
      fmt::format("attention at {} rows vs the reference: relative L2 {:.2e} (tolerance {:.0e})",
                  spot.rows.size(), spot.relative_l2, spot.tolerance);
  if (spot.attention_unwritten != 0)
    text += fmt::format(", {} attention elements unwritten", spot.attention_unwritten);
  if (spot.output_unwritten != 0)
    text += fmt::format(", {} output elements unwritten", spot.output_unwritten);
  if (spot.output_non_finite != 0)
    text += fmt::format(", {} output elements NaN or infinite", spot.output_non_finite);
  if (spot.attention_unwritten + spot.output_unwritten + spot.output_non_finite == 0)
    text += ", every output written and finite";
  return text;
}

// Launches the trace records (--trace-attention): one per rotation set, at most this many.
constexpr int kTracedLaunches = 8;

// Runs the plan once on each of the first kTracedLaunches sets, back to back after the timed passes (so at
// the same clocks), with each set's trace region zeroed first, and returns every launch's trace. `spec`: the
// attention kernel the launches run (the sets share one batch; PrefillPlan::attention_variant's).
nlohmann::ordered_json trace_attention(const plan::PrefillPlan& plan, const plan::AttentionSpec& spec,
                                       const std::vector<DeviceSet>& sets) {
  const plan::WorkspaceLayout layout = plan.workspace_layout(sets.front().args.batch.num_tokens);
  if (!spec.traces || layout.attention_trace_bytes != static_cast<std::size_t>(kAttentionTraceBytes)) {
    throw Error(Stage::internal, "bench: --trace-attention, but the plan's attention kernel does not trace");
  }
  const driver::CudaApi& cu = driver::api();
  driver::Stream stream = driver::Stream::create();
  const std::size_t launches = std::min(sets.size(), static_cast<std::size_t>(kTracedLaunches));
  for (std::size_t i = 0; i < launches; ++i) {
    driver::check(cu.cuMemsetD8Async(sets[i].workspace.address() + layout.attention_trace, 0,
                                     layout.attention_trace_bytes, stream.handle()),
                  "cuMemsetD8Async");
  }
  for (std::size_t i = 0; i < launches; ++i) plan.execute(sets[i].args, stream.handle());
  stream.synchronize();
  nlohmann::ordered_json traces = nlohmann::ordered_json::array();
  const int roles = spec.threads() / 128;  // the producer and the consumer warpgroups
  for (std::size_t i = 0; i < launches; ++i) {
    std::vector<std::uint64_t> words(layout.attention_trace_bytes / 8);
    sets[i].workspace.download(words.data(), layout.attention_trace_bytes, layout.attention_trace);
    traces.push_back(check::to_json(check::decode_attention_trace(words, roles)));
  }
  return traces;
}

double tflops(const Row& row) {
  return row.flops / (row.ms.median * 1e-3) / 1e12;
}
double gbs(const Row& row) {
  return row.bytes / (row.ms.median * 1e-3) / 1e9;
}

}  // namespace

Command bench_command() {
  Command command;
  command.name = "bench";
  command.synopsis =
      "bench CONFIG [--tokens N] [--seqs S] [--prefix P] [--block-size B] [--mask M] [--iterations I] "
      "[--warmup W] [--warmup-ms T] [--trace-attention FILE] [--no-check] [--json]";
  command.description =
      "Times each stage of the config's prefill plan on the GPU (CUDA events; first at least W warm-up runs\n"
      "and T ms of back-to-back work, so the GPU runs at its sustained clocks; then the median, min and max\n"
      "over --iterations runs), rotating among enough copies of the inputs, weights and KV pool to exceed\n"
      "twice the L2. Random bf16 data; S sequences of unequal lengths share N new tokens,\n"
      "each with P tokens already cached. Reports ms, TFLOP/s for the GEMMs and attention (attention FLOPs\n"
      "over allowed (query, key) pairs only) and GB/s for the memory-bound stages, then the whole layer as\n"
      "one execute() and as a replayed CUDA graph. Before timing, a spot check: one run whose attention\n"
      "output at 16 token rows (each sequence's first and last, then spread) must match the "
      "double-precision\n"
      "reference on the GPU's own queries and KV cache (relative L2 <= 1e-2), with every output element\n"
      "written and finite; otherwise nothing is timed and the exit code is 2. Exit 1 for bad input or when\n"
      "no CUDA device is usable.";
  command.options = {
      {"--tokens", "N", "new tokens over all sequences (default min(4096, max_tokens))"},
      {"--seqs", "S", "sequences sharing them, unequal lengths (default 1)"},
      {"--prefix", "P", "tokens already cached per sequence (default 0)"},
      {"--block-size", "B", "KV page size in tokens (default: the config's)"},
      {"--mask", "M", "causal (default) or bidirectional (one span over each chunk; prefix 0)"},
      {"--iterations", "I", "timed runs (default 50)"},
      {"--warmup", "W", "untimed runs first, at least (default 5)"},
      {"--warmup-ms", "T", "untimed work first, at least, ms (default 300; 0: W runs only)"},
      {"--seed", "X", "random seed (default 1)"},
      {"--arch", "A", "compile for A instead of the device's arch"},
      kCacheDirOption,
      kCachePathOption,
      kJitOption,
      {"--trace-attention", "FILE",
       "run the attention kernel's traced specialization (sm_90a: each warpgroup's clock at fixed points of "
       "every work item) and write the records of a few launches as JSON to FILE (tools/attention_trace.py "
       "reads it; docs/attention-trace.md). The stage times then include the trace's stores"},
      {"--no-check", "", "skip the spot check (see above)"},
      {"--json", "", "print one JSON object with a row per stage"}};
  command.run = [](const Arguments& args) {
    BenchRequest request = parse_request(args);
    const config::AttentionConfig& config = request.config;
    const std::vector<check::StageWork> work = check::stage_work(config, request.sequences);
    std::string reason;
    if (!driver::device_available(&reason)) {
      throw Error(Stage::input,
                  fmt::format("bench: no CUDA device ({}); bench times kernels on a GPU", reason));
    }

    const std::optional<std::string> trace_file = args.value("--trace-attention");
    if (trace_file && trace_file->empty()) {
      throw Error(Stage::input, "--trace-attention: needs a file name to write the trace to");
    }
    RuntimeOptions options = runtime_options(args);
    options.trace_attention = trace_file.has_value();
    Runtime runtime(std::move(options));
    driver::Context context(runtime.options().device);
    context.make_current();
    const driver::DeviceInfo device = driver::query_device(runtime.options().device);
    const plan::PrefillPlan plan = runtime.load(runtime.compile(config));

    check::Scenario scenario;
    scenario.tokens = request.tokens;
    scenario.seqs = static_cast<int>(request.sequences.size());
    scenario.seed = request.seed;
    for (const auto& sequence : request.sequences) {
      scenario.chunk_lens.push_back(sequence.chunk_len);
      scenario.context_lens.push_back(sequence.context_len);
    }
    check::LayerCase layer = check::random_case(config, scenario);
    if (config.bidirectional_spans) {
      // Exactly the spans the FLOPs were counted for: none (causal) or one per chunk (bidirectional).
      layer.spans.offsets = {0};
      layer.spans.bounds.clear();
      for (const auto& sequence : request.sequences) {
        for (const auto& span : sequence.spans) layer.spans.bounds.push_back(span);
        layer.spans.offsets.push_back(static_cast<int>(layer.spans.bounds.size()));
      }
    }
    // The batch arrays are shared by every set (a few KB: they never decide the L2's contents).
    const check::DeviceBatch batch(layer.batch, layer.spans, config.bidirectional_spans);
    std::vector<DeviceSet> sets;
    const check::InitialKvPools pools(layer);
    sets.push_back(upload_set(layer, pools, plan, batch));
    std::size_t free_bytes = 0, total_bytes = 0;
    driver::check(driver::api().cuMemGetInfo(&free_bytes, &total_bytes), "cuMemGetInfo");
    const int set_count =
        check::rotation_sets(sets.front().bytes(), static_cast<std::size_t>(device.l2_bytes), free_bytes);
    while (static_cast<int>(sets.size()) < set_count) sets.push_back(upload_set(layer, pools, plan, batch));
    driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");

    // A plan whose attention is wrong is not timed: an A/B of a broken kernel would read as a speed-up.
    std::optional<check::SpotCheck> spot;
    if (!args.flag("--no-check")) {
      spot = check::spot_check(plan, layer, sets.front().args, kSpotRows);
      if (!spot->passed()) {
        fmt::print(stderr, "bench: not timed, the spot check failed: {}\n", describe(*spot));
        return kExitFailure;
      }
    }

    const std::vector<Row> rows =
        measure(plan, sets, work, request.iterations, request.warmup, request.warmup_ms);

    std::vector<int> lengths;
    for (const auto& sequence : request.sequences) lengths.push_back(sequence.chunk_len);
    // The run's shape, leading both the --json output and the trace file.
    const nlohmann::ordered_json shape = {{"config", config.name},
                                          {"arch", plan.compiled().arch.name()},
                                          {"device", device.name},
                                          {"driver_version", device.driver_version},
                                          {"tokens", request.tokens},
                                          {"seqs", lengths.size()},
                                          {"chunk_lens", lengths},
                                          {"prefix", request.prefix},
                                          {"block_size", config.kv_cache.block_size},
                                          {"mask", request.bidirectional ? "bidirectional" : "causal"},
                                          {"window", config.sliding_window.value_or(0)}};
    if (trace_file) {
      const auto names = [](std::span<const std::string_view> events) {
        return std::vector<std::string_view>(events.begin(), events.end());
      };
      nlohmann::ordered_json trace = shape;
      const plan::AttentionVariant launched = plan.attention_variant(sets.front().args.batch);
      const plan::AttentionSpec& launched_spec =
          plan::attention_variant_spec(plan.compiled().kernels_planned, launched);
      trace["kernels"] = std::vector<std::string>{std::string(plan::attention_kernel_name(launched))};
      trace["attention"] = launched_spec.source().spec;
      trace["producer_events"] = names(check::producer_event_names());
      trace["consumer_events"] = names(check::consumer_event_names());
      trace["launches"] = trace_attention(plan, launched_spec, sets);
      core::write_file_atomic(*trace_file, trace.dump() + "\n");
    }
    if (args.flag("--json")) {
      nlohmann::ordered_json out_rows = nlohmann::ordered_json::array();
      for (const Row& row : rows) {
        nlohmann::ordered_json entry = {{"stage", row.name},          {"kernel", row.kernel},
                                        {"median_ms", row.ms.median}, {"min_ms", row.ms.min},
                                        {"max_ms", row.ms.max},       {"flops", row.flops},
                                        {"bytes", row.bytes}};
        entry["tflops"] =
            row.flops > 0 ? nlohmann::ordered_json(tflops(row)) : nlohmann::ordered_json(nullptr);
        entry["gbs"] = row.flops == 0 ? nlohmann::ordered_json(gbs(row)) : nlohmann::ordered_json(nullptr);
        nlohmann::ordered_json runs = nlohmann::ordered_json::array();
        for (const double ms : row.runs_ms) runs.push_back(std::round(ms * 1e4) / 1e4);  // 0.1 us
        entry["runs_ms"] = std::move(runs);
        out_rows.push_back(entry);
      }
      nlohmann::ordered_json out = shape;
      out["iterations"] = request.iterations;
      out["warmup"] = request.warmup;
      out["warmup_ms"] = request.warmup_ms;
      out["rotation_sets"] = sets.size();
      out["set_bytes"] = sets.front().bytes();
      out["l2_bytes"] = device.l2_bytes;
      if (spot) {
        out["check"] = {{"rows", spot->rows.size()},
                        {"attention_relative_l2", spot->relative_l2},
                        {"tolerance", spot->tolerance},
                        {"passed", spot->passed()}};
      }
      out["rows"] = std::move(out_rows);
      fmt::print("{}\n", out.dump(2));
    } else {
      fmt::print("{} on {} ({}): {} tokens in {} sequence(s) [{}], prefix {}, block {}, {}{}\n",
                 config.name.empty() ? "config" : config.name, device.name, plan.compiled().arch.name(),
                 request.tokens, lengths.size(), fmt::join(lengths, " "), request.prefix,
                 config.kv_cache.block_size, request.bidirectional ? "bidirectional" : "causal",
                 config.sliding_window ? fmt::format(", window {}", *config.sliding_window) : "");
      fmt::print(
          "{} runs after >= {} warm-up runs and >= {} ms, rotating {} sets of {:.1f} MB (L2 {:.1f} MB)\n",
          request.iterations, request.warmup, request.warmup_ms, sets.size(),
          double(sets.front().bytes()) / 1e6, double(device.l2_bytes) / 1e6);
      fmt::print("check: {}\n\n", spot ? describe(*spot) : "skipped (--no-check)");
      std::size_t kernel_width = 20;  // a dequantized path names two kernels
      for (const Row& row : rows) kernel_width = std::max(kernel_width, row.kernel.size());
      fmt::print("{:<18} {:<{}} {:>10} {:>10} {:>10} {:>10} {:>9}\n", "stage", "kernel", kernel_width,
                 "median ms", "min ms", "max ms", "TFLOP/s", "GB/s");
      for (const Row& row : rows) {
        fmt::print("{:<18} {:<{}} {:>10.4f} {:>10.4f} {:>10.4f} {:>10} {:>9}\n", row.name, row.kernel,
                   kernel_width, row.ms.median, row.ms.min, row.ms.max,
                   row.flops > 0 ? fmt::format("{:.1f}", tflops(row)) : "",
                   row.flops == 0 ? fmt::format("{:.0f}", gbs(row)) : "");
      }
    }
    return kExitOk;
  };
  return command;
}

}  // namespace attnplan::cli
