// Reliability of execute() on the device (issue 8): every field it checks, rejected with Error(input) naming
// the field and changing nothing (output and every KV slot byte-identical afterwards); one plan executed on
// two streams at once and from 8 host threads at once, byte-identical to serial runs.
// Small cases (60 tokens, hidden 512) so that the whole file runs under compute-sanitizer in seconds.
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "check/layer_check.hpp"
#include "core/error.hpp"
#include "driver/cuda_api.hpp"
#include "driver/memory.hpp"
#include "driver/stream.hpp"
#include "gpu_support.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using namespace attnplan;
using namespace attnplan::gpu_testing;

namespace {

void synchronize_context() {
  driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");
}

// Two sequences of 30 tokens after prefixes of 10 and 17: spans, prefixes and shared pages all apply.
check::LayerCase small_case(const config::AttentionConfig& config, std::uint64_t seed) {
  check::Scenario scenario;
  scenario.tokens = 60;
  scenario.seqs = 2;
  scenario.chunk_lens = {30, 30};
  scenario.context_lens = {10, 17};
  scenario.seed = seed;
  return check::random_case(config, scenario);
}

// A case whose output is poisoned and whose whole KV pool (prefix, chunk and spare slots alike) holds a
// known random pattern, so that any write anywhere shows up byte for byte.
class GuardedCase {
 public:
  GuardedCase(const plan::PrefillPlan& plan, const check::LayerCase& layer, std::uint64_t seed)
      : device_(plan, layer) {
    std::mt19937_64 rng(seed);
    key_pattern_ = random_bf16(layer.key_cache.size(), rng);
    value_pattern_ = random_bf16(layer.value_cache.size(), rng);
    device_.keys.upload(key_pattern_);
    device_.values.upload(value_pattern_);
    device_.output.fill_bytes(kPoisonByte);
    synchronize_context();  // pageable uploads and memsets may still be in flight otherwise
  }

  const plan::ExecuteArgs& args() const { return device_.args; }

  // After synchronizing: the output is still all poison and every slot of both pools is unchanged.
  void expect_untouched() const {
    synchronize_context();
    const std::vector<std::uint16_t> output = device_.output.download_all<std::uint16_t>();
    std::size_t written = 0;
    for (std::uint16_t bits : output) written += bits != kPoisonBits;
    CHECK(written == 0);
    CHECK(device_.keys.download_all<std::uint16_t>() == key_pattern_);
    CHECK(device_.values.download_all<std::uint16_t>() == value_pattern_);
  }

  DeviceCase& device() { return device_; }

 private:
  DeviceCase device_;
  std::vector<std::uint16_t> key_pattern_, value_pattern_;
};

using Mutation = std::function<void(plan::ExecuteArgs&)>;

// execute() with one field changed must throw Error(input) whose message contains every `needles`
// entry, and must leave the output and the pools as they were.
void expect_rejected(const plan::PrefillPlan& plan, GuardedCase& guarded, const std::string& what,
                     const std::vector<std::string>& needles, const Mutation& mutate) {
  INFO(what);
  plan::ExecuteArgs args = guarded.args();
  mutate(args);
  driver::Stream stream = driver::Stream::create();
  const Error error = expect_error([&] { plan.execute(args, stream.handle()); });
  INFO(error.what());
  CHECK(error.stage() == Stage::input);
  for (const std::string& needle : needles) CHECK(contains(error.message(), needle));
  stream.synchronize();
  guarded.expect_untouched();
}

const void* shifted(const void* pointer, std::size_t bytes) {
  return static_cast<const char*>(pointer) + bytes;
}

// Each weight execute() requires for `config`, by name and member.
struct WeightField {
  const char* name;
  const void* plan::LayerWeightsView::*member;
};

std::vector<WeightField> required_weights(const config::AttentionConfig& config) {
  using View = plan::LayerWeightsView;
  std::vector<WeightField> fields{{"weights.input_norm", &View::input_norm},
                                  {"weights.o_proj", &View::o_proj}};
  if (config.projection.fused_qkv) {
    fields.push_back({"weights.qkv_proj", &View::qkv_proj});
    if (config.qkv_bias) fields.push_back({"weights.qkv_bias", &View::qkv_bias});
  } else {
    fields.insert(fields.end(), {{"weights.q_proj", &View::q_proj},
                                 {"weights.k_proj", &View::k_proj},
                                 {"weights.v_proj", &View::v_proj}});
    if (config.qkv_bias) {
      fields.insert(fields.end(), {{"weights.q_bias", &View::q_bias},
                                   {"weights.k_bias", &View::k_bias},
                                   {"weights.v_bias", &View::v_bias}});
    }
  }
  if (config.qkv_norm.query) fields.push_back({"weights.q_norm", &View::q_norm});
  if (config.qkv_norm.key) fields.push_back({"weights.k_norm", &View::k_norm});
  if (config.output_bias) fields.push_back({"weights.o_bias", &View::o_bias});
  return fields;
}

// Null and misaligned (2 bytes past a bf16 array: still inside it, not 16-byte aligned) for every weight.
void expect_weights_checked(const plan::PrefillPlan& plan, GuardedCase& guarded) {
  const config::AttentionConfig& config = plan.compiled().config;
  for (const WeightField& field : required_weights(config)) {
    const std::string name = field.name;
    expect_rejected(plan, guarded, name + " null", {name + ": null device pointer"},
                    [&](plan::ExecuteArgs& a) { a.weights.*field.member = nullptr; });
    expect_rejected(
        plan, guarded, name + " misaligned", {name + ": device pointer", "not aligned to 16 bytes"},
        [&](plan::ExecuteArgs& a) { a.weights.*field.member = shifted(a.weights.*field.member, 2); });
  }
}

// The pointers of the call itself: input, output, workspace and both caches.
void expect_pointers_checked(const plan::PrefillPlan& plan, GuardedCase& guarded) {
  expect_rejected(plan, guarded, "input null", {"input: null device pointer"},
                  [](plan::ExecuteArgs& a) { a.input = nullptr; });
  expect_rejected(plan, guarded, "input misaligned", {"input: device pointer", "not aligned to 16 bytes"},
                  [](plan::ExecuteArgs& a) { a.input = shifted(a.input, 2); });
  expect_rejected(plan, guarded, "output null", {"output: null device pointer"},
                  [](plan::ExecuteArgs& a) { a.output = nullptr; });
  expect_rejected(plan, guarded, "output misaligned", {"output: device pointer", "not aligned to 16 bytes"},
                  [](plan::ExecuteArgs& a) { a.output = static_cast<char*>(a.output) + 2; });
  expect_rejected(plan, guarded, "key_cache null", {"cache.key_cache: null device pointer"},
                  [](plan::ExecuteArgs& a) { a.cache.key_cache = nullptr; });
  expect_rejected(
      plan, guarded, "key_cache misaligned", {"cache.key_cache: device pointer", "16 bytes"},
      [](plan::ExecuteArgs& a) { a.cache.key_cache = static_cast<char*>(a.cache.key_cache) + 2; });
  expect_rejected(plan, guarded, "value_cache null", {"cache.value_cache: null device pointer"},
                  [](plan::ExecuteArgs& a) { a.cache.value_cache = nullptr; });
  expect_rejected(
      plan, guarded, "value_cache misaligned", {"cache.value_cache: device pointer", "16 bytes"},
      [](plan::ExecuteArgs& a) { a.cache.value_cache = static_cast<char*>(a.cache.value_cache) + 2; });
  expect_rejected(plan, guarded, "workspace null", {"workspace: null device pointer"},
                  [](plan::ExecuteArgs& a) { a.workspace = nullptr; });
  expect_rejected(plan, guarded, "workspace misaligned",
                  {"workspace: device pointer", "not aligned to 256 bytes"},
                  [](plan::ExecuteArgs& a) { a.workspace = static_cast<char*>(a.workspace) + 16; });
  expect_rejected(plan, guarded, "workspace too small", {"workspace_bytes: 1024 bytes is less than"},
                  [](plan::ExecuteArgs& a) { a.workspace_bytes = 1024; });
}

// The good arguments work: the output is written in full (no poison left), so every rejection above was
// caused by its one field alone.
void expect_accepted(const plan::PrefillPlan& plan, GuardedCase& guarded) {
  driver::Stream stream = driver::Stream::create();
  plan.execute(guarded.args(), stream.handle());
  stream.synchronize();
  const std::vector<std::uint16_t> output = guarded.device().output.download_all<std::uint16_t>();
  std::size_t unwritten = 0;
  for (std::uint16_t bits : output) unwritten += bits == kPoisonBits;
  CHECK(unwritten == 0);
}

}  // namespace

TEST_CASE("execute rejects each bad batch field with its message and changes nothing",
          "[gpu][reliability][rejects][batch]") {
  const config::AttentionConfig config =
      config_from({{"qkv_bias", true}, {"bidirectional_spans", true}, {"kv_cache", {{"block_size", 16}}}});
  const check::LayerCase layer = small_case(config, 801);
  const plan::PrefillPlan plan = gpu().load(config);
  GuardedCase guarded(plan, layer, 802);
  const int max_blocks = layer.batch.max_blocks_per_seq;
  const int pool = layer.num_blocks;

  // Host arrays the mutations point at; they outlive every call.
  std::vector<int> past_pool = layer.batch.block_tables;
  past_pool[0] = pool;
  std::vector<int> negative_page = layer.batch.block_tables;
  negative_page[1] = -1;
  // Sequence 1's last page (where its chunk ends) made the same as sequence 0's last page.
  std::vector<int> shared_written = layer.batch.block_tables;
  const int last0 = (10 + 30 - 1) / 16, last1 = (17 + 30 - 1) / 16;
  shared_written[std::size_t(max_blocks) + last1] = shared_written[last0];
  const std::vector<int> long_context{10, max_blocks * 16};  // its chunk would run past its block table
  const std::vector<int> negative_context{-1, 17};
  const std::vector<int> unsorted_starts{0, 70, 60};
  const std::vector<int> short_starts{0, 30, 59};
  const std::vector<int> one_context{10};
  // Sequence 0 holds positions [0, 40) (prefix 10); sequence 1 positions [0, 47) (prefix 17).
  const std::vector<int> two_spans{0, 2, 2}, one_span{0, 1, 1}, no_spans{0, 0, 0};
  const std::vector<int> overlapping{12, 20, 18, 25}, unsorted{20, 25, 12, 18};
  const std::vector<int> straddling{5, 15}, past_end{30, 41}, empty{20, 20};

  using A = plan::ExecuteArgs;
  struct Case {
    const char* what;
    std::vector<std::string> needles;
    Mutation mutate;
  };
  const std::vector<Case> cases{
      {"block table entry past the pool",
       {fmt::format("block_tables[0][0]: page {} is outside the pool of {} pages", pool, pool)},
       [&](A& a) { a.batch.host_block_tables = past_pool; }},
      {"negative block table entry",
       {"block_tables[0][1]: page -1 is outside the pool"},
       [&](A& a) { a.batch.host_block_tables = negative_page; }},
      {"a pool smaller than the pages referenced",
       {"is outside the pool of 1 pages"},
       [&](A& a) { a.cache.num_blocks = 1; }},
      {"a page receiving two sequences' chunk tokens",
       {fmt::format("block_tables[1][{}]", last1),
        "receives this chunk's tokens of sequence 1 and of sequence 0"},
       [&](A& a) { a.batch.host_block_tables = shared_written; }},
      {"a chunk whose slots would leave its block table",
       {"context_lens[1]: sequence 1 reaches position", "block_tables has"},
       [&](A& a) { a.batch.host_context_lens = long_context; }},
      {"negative context_len",
       {"context_lens[0]: -1 must be non-negative"},
       [&](A& a) { a.batch.host_context_lens = negative_context; }},
      {"num_tokens beyond max_tokens",
       {fmt::format("num_tokens: {} is outside [0, max_tokens = {}]", config.max_tokens + 1,
                    config.max_tokens)},
       [&](A& a) { a.batch.num_tokens = config.max_tokens + 1; }},
      {"query_starts not ending at num_tokens",
       {"query_starts[2]: 59 must equal num_tokens 60"},
       [&](A& a) { a.batch.host_query_starts = short_starts; }},
      {"decreasing query_starts",
       {"query_starts[2]: 60 is less than query_starts[1] = 70"},
       [&](A& a) { a.batch.host_query_starts = unsorted_starts; }},
      {"max_query_len below the longest chunk",
       {"max_query_len: 29 is less than the longest chunk, 30 tokens"},
       [&](A& a) { a.batch.max_query_len = 29; }},
      {"max_query_len beyond max_tokens",
       {fmt::format("max_query_len: {} is outside [0, max_tokens", config.max_tokens + 1)},
       [&](A& a) { a.batch.max_query_len = config.max_tokens + 1; }},
      {"no sequences", {"num_seqs: 0 must be at least 1"}, [&](A& a) { a.batch.num_seqs = 0; }},
      {"host array of the wrong length",
       {"host_context_lens: 1 entries, expected num_seqs = 2"},
       [&](A& a) { a.batch.host_context_lens = one_context; }},
      {"null query_starts",
       {"query_starts: null device pointer"},
       [&](A& a) { a.batch.query_starts = nullptr; }},
      {"null context_lens",
       {"context_lens: null device pointer"},
       [&](A& a) { a.batch.context_lens = nullptr; }},
      {"null block_tables",
       {"block_tables: null device pointer"},
       [&](A& a) { a.batch.block_tables = nullptr; }},
      {"misaligned block_tables",
       {"block_tables: device pointer", "not aligned to 4 bytes"},
       [&](A& a) { a.batch.block_tables = static_cast<const int*>(shifted(a.batch.block_tables, 2)); }},
      {"null span_bounds",
       {"span_bounds: null device pointer"},
       [&](A& a) { a.batch.span_bounds = nullptr; }},
      {"overlapping spans",
       {"span_bounds[1] (sequence 0) [18, 25)", "overlaps or precedes the previous span"},
       [&](A& a) {
         a.batch.host_span_offsets = two_spans;
         a.batch.host_span_bounds = overlapping;
       }},
      {"unsorted spans",
       {"span_bounds[1] (sequence 0) [12, 18)", "overlaps or precedes"},
       [&](A& a) {
         a.batch.host_span_offsets = two_spans;
         a.batch.host_span_bounds = unsorted;
       }},
      {"a span straddling context_len",
       {"span_bounds[0] (sequence 0) [5, 15)", "straddles context_len 10"},
       [&](A& a) {
         a.batch.host_span_offsets = one_span;
         a.batch.host_span_bounds = straddling;
       }},
      {"a span past the sequence's end",
       {"span_bounds[0] (sequence 0) [30, 41)", "ends past the sequence's 40 tokens"},
       [&](A& a) {
         a.batch.host_span_offsets = one_span;
         a.batch.host_span_bounds = past_end;
       }},
      {"an empty span",
       {"span_bounds[0] (sequence 0) [20, 20)", "must be non-empty"},
       [&](A& a) {
         a.batch.host_span_offsets = one_span;
         a.batch.host_span_bounds = empty;
       }},
      {"span offsets that do not end at the number of spans",
       {"span_offsets: must start at 0 and end at the number of spans"},
       [&](A& a) {
         a.batch.host_span_offsets = no_spans;
         a.batch.host_span_bounds = straddling;
       }},
  };
  for (const Case& c : cases) expect_rejected(plan, guarded, c.what, c.needles, c.mutate);

  // An empty chunk is a valid no-op: nothing is launched and nothing changes.
  const std::vector<int> no_tokens{0, 0, 0};
  plan::ExecuteArgs empty_chunk = guarded.args();
  empty_chunk.batch.num_tokens = 0;
  empty_chunk.batch.max_query_len = 0;
  empty_chunk.batch.host_query_starts = no_tokens;
  empty_chunk.batch.host_span_offsets = no_spans;
  empty_chunk.batch.host_span_bounds = {};
  CHECK_NOTHROW(plan.execute(empty_chunk, nullptr));
  guarded.expect_untouched();

  expect_accepted(plan, guarded);
}

TEST_CASE("execute rejects each bad pointer and weight with its message and changes nothing",
          "[gpu][reliability][rejects][pointers]") {
  SECTION("separate q/k/v with biases, q/k norms and an output bias") {
    const config::AttentionConfig config = config_from(
        {{"qkv_bias", true}, {"output_bias", true}, {"qkv_norm", {{"query", true}, {"key", true}}}});
    const plan::PrefillPlan plan = gpu().load(config);
    GuardedCase guarded(plan, small_case(config, 811), 812);
    expect_pointers_checked(plan, guarded);
    expect_weights_checked(plan, guarded);
    expect_rejected(plan, guarded, "a fused weight on a separate-projection plan",
                    {"weights.qkv_proj: given, but projection.fused_qkv is false"},
                    [](plan::ExecuteArgs& a) { a.weights.qkv_proj = a.weights.q_proj; });
    expect_rejected(
        plan, guarded, "sinks on a plan without sinks", {"weights.sinks: given, but sinks is false"},
        [](plan::ExecuteArgs& a) { a.weights.sinks = static_cast<const float*>(a.weights.o_proj); });
    expect_accepted(plan, guarded);
  }
  SECTION("fused qkv with bias, sinks and a window; spans not allowed") {
    const config::AttentionConfig config = config_from(
        {{"qkv_bias", true}, {"sinks", true}, {"sliding_window", 32}, {"projection", {{"fused_qkv", true}}}});
    const plan::PrefillPlan plan = gpu().load(config);
    GuardedCase guarded(plan, small_case(config, 821), 822);
    expect_weights_checked(plan, guarded);
    expect_rejected(plan, guarded, "sinks null", {"weights.sinks: null device pointer"},
                    [](plan::ExecuteArgs& a) { a.weights.sinks = nullptr; });
    expect_rejected(plan, guarded, "sinks misaligned",
                    {"weights.sinks: device pointer", "not aligned to 4 bytes"}, [](plan::ExecuteArgs& a) {
                      a.weights.sinks = static_cast<const float*>(shifted(a.weights.sinks, 2));
                    });
    expect_rejected(plan, guarded, "a separate weight on a fused plan",
                    {"weights.k_proj: given, but projection.fused_qkv is true"},
                    [](plan::ExecuteArgs& a) { a.weights.k_proj = a.weights.qkv_proj; });
    const std::vector<int> offsets{0, 1, 1}, bounds{12, 20};
    expect_rejected(plan, guarded, "spans on a plan without spans",
                    {"span_offsets: this plan's config has bidirectional_spans false"},
                    [&](plan::ExecuteArgs& a) {
                      a.batch.span_offsets = a.batch.span_bounds = a.batch.query_starts;
                      a.batch.host_span_offsets = offsets;
                      a.batch.host_span_bounds = bounds;
                    });
    expect_accepted(plan, guarded);
  }
}

namespace {

struct RunResult {
  std::vector<std::uint16_t> output, keys, values;
  bool operator==(const RunResult&) const = default;
};

RunResult results_of(const DeviceCase& device) {
  return {device.output.download_all<std::uint16_t>(), device.keys.download_all<std::uint16_t>(),
          device.values.download_all<std::uint16_t>()};
}

// Puts a case back to its initial state (the layer's pools, a poisoned output) and waits for the copies.
void reset(DeviceCase& device, const check::LayerCase& layer) {
  device.keys.upload(layer.key_cache);
  device.values.upload(layer.value_cache);
  device.output.fill_bytes(kPoisonByte);
  synchronize_context();
}

std::size_t poisoned(const std::vector<std::uint16_t>& bits) {
  std::size_t count = 0;
  for (std::uint16_t value : bits) count += value == kPoisonBits;
  return count;
}

}  // namespace

TEST_CASE("one plan on two streams at once, separate workspaces and pools, equals serial runs",
          "[gpu][reliability][concurrency][streams]") {
  const config::AttentionConfig config = config_from({{"qkv_norm", {{"query", true}, {"key", true}}}});
  const plan::PrefillPlan plan = gpu().load(config);
  const check::LayerCase first_layer = small_case(config, 831), second_layer = small_case(config, 832);
  DeviceCase first(plan, first_layer), second(plan, second_layer);
  driver::Stream first_stream = driver::Stream::create(), second_stream = driver::Stream::create();

  // Serial: one at a time, each synchronized before the next starts.
  reset(first, first_layer);
  plan.execute(first.args, first_stream.handle());
  first_stream.synchronize();
  const RunResult first_serial = results_of(first);
  reset(second, second_layer);
  plan.execute(second.args, second_stream.handle());
  second_stream.synchronize();
  const RunResult second_serial = results_of(second);
  CHECK(poisoned(first_serial.output) == 0);
  CHECK(poisoned(second_serial.output) == 0);
  CHECK(first_serial.output != second_serial.output);  // different inputs, so a mix-up would show

  // Concurrent: both enqueued before either is waited for, three times over.
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    reset(first, first_layer);
    reset(second, second_layer);
    plan.execute(first.args, first_stream.handle());
    plan.execute(second.args, second_stream.handle());
    first_stream.synchronize();
    second_stream.synchronize();
    CHECK(results_of(first) == first_serial);
    CHECK(results_of(second) == second_serial);
  }
}

TEST_CASE("one plan executed from 8 host threads, each on its own stream, equals serial runs",
          "[gpu][reliability][concurrency][threads]") {
  constexpr int kThreads = 8;
  const config::AttentionConfig config = config_from({{"qkv_bias", true}});
  const plan::PrefillPlan plan = gpu().load(config);
  std::vector<check::LayerCase> layers;
  std::vector<std::unique_ptr<DeviceCase>> devices;
  for (int t = 0; t < kThreads; ++t) {
    layers.push_back(small_case(config, 840 + t));
    devices.push_back(std::make_unique<DeviceCase>(plan, layers.back()));
  }
  std::vector<RunResult> serial;
  {
    driver::Stream stream = driver::Stream::create();
    for (int t = 0; t < kThreads; ++t) {
      reset(*devices[t], layers[t]);
      plan.execute(devices[t]->args, stream.handle());
      stream.synchronize();
      serial.push_back(results_of(*devices[t]));
      CHECK(poisoned(serial.back().output) == 0);
    }
  }
  for (int t = 0; t < kThreads; ++t) reset(*devices[t], layers[t]);

  // Each thread binds the context (a context is current per thread), makes its own stream, executes.
  std::vector<std::string> failures(kThreads);  // what each thread threw, if anything
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        gpu().context.make_current();
        driver::Stream stream = driver::Stream::create();
        plan.execute(devices[t]->args, stream.handle());
        stream.synchronize();
      } catch (const std::exception& error) {
        failures[t] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t);
    CHECK(failures[t] == "");  // shows the message if not
    CHECK(results_of(*devices[t]) == serial[t]);
  }
}
