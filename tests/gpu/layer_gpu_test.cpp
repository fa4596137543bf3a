// The whole layer (spec sections 1-8) on the GPU against the double-precision reference, stage by stage,
// over the feature matrix of the whole-plan issue and every plan in plans/.
#include <algorithm>
#include <filesystem>

#include "check/device_batch.hpp"
#include "check/device_weights.hpp"
#include "check/layer_check.hpp"
#include "config/parse.hpp"
#include "core/bf16.hpp"
#include "driver/cuda_api.hpp"
#include "driver/memory.hpp"
#include "driver/stream.hpp"
#include "gpu_support.hpp"
#include "plan/kernel_plan.hpp"
#include "reference/compare.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::gpu_testing;

namespace {

// `plan` (of `config`) on a random case of `scenario` against the reference, stage by stage.
void check_plan(const plan::PrefillPlan& plan, const config::AttentionConfig& config,
                const check::Scenario& scenario) {
  const check::Report report = check::run_case(plan, check::random_case(config, scenario));
  for (const check::StageResult& stage : report.stages) {
    INFO(stage.stage << " relative L2 " << stage.relative_l2);
    CHECK(stage.passed());
  }
  CHECK(report.unwritten == 0);
  CHECK(report.cache_slots_damaged == 0);
}

void check_layer(const std::string& what, const config::AttentionConfig& config,
                 const check::Scenario& scenario) {
  INFO(what << ": " << scenario.tokens << " tokens, " << scenario.seqs << " seqs, prefix "
            << scenario.prefix);
  check_plan(gpu().load(config), config, scenario);
}

// check_layer, first checking which path the chunk takes for its q/k/v norms and RoPE: the q|k|v GEMM's
// epilogue (`fused`) or the postprocess kernel after it.
void check_layer_path(const std::string& what, const config::AttentionConfig& config,
                      const check::Scenario& scenario, bool fused) {
  INFO(what << ": " << scenario.tokens << " tokens");
  CHECK(gpu().load(config).qkv_postprocess_fused(scenario.tokens) == fused);
  check_layer(what, config, scenario);
}

check::Scenario scenario(int tokens, int seqs, int prefix, std::uint64_t seed) {
  check::Scenario s;
  s.tokens = tokens;
  s.seqs = seqs;
  s.prefix = prefix;
  s.seed = seed;
  return s;
}

}  // namespace

TEST_CASE("head dims, value head dims and GQA group sizes", "[gpu][layer]") {
  check_layer("D 64, GQA 4", config_from({}), scenario(133, 2, 17, 1));
  check_layer("D 128, GQA 8", config_from({{"query_heads", 16}, {"kv_heads", 2}, {"head_dim", 128}}),
              scenario(200, 3, 40, 2));
  check_layer("D 256, MHA", config_from({{"query_heads", 4}, {"kv_heads", 4}, {"head_dim", 256}}),
              scenario(77, 1, 0, 3));
  check_layer("MQA", config_from({{"kv_heads", 1}}), scenario(90, 2, 5, 4));
  check_layer("Dv 64 != D 128", config_from({{"head_dim", 128}, {"value_head_dim", 64}}),
              scenario(64, 1, 30, 5));
}

TEST_CASE("RoPE: partial, pairing, offset and every scaling", "[gpu][layer][rope]") {
  check_layer("interleaved P2=2", config_from({{"rotary", {{"pairing_dim", 2}}}}), scenario(70, 2, 100, 6));
  check_layer("partial R=D/4", config_from({{"rotary", {{"dim", 16}}}}), scenario(70, 1, 3, 7));
  check_layer(
      "Phi-4-mini R=96 of 128",
      config_from({{"head_dim", 128}, {"rotary", {{"dim", 96}}}, {"projection", {{"fused_qkv", true}}}}),
      scenario(50, 1, 0, 8));
  check_layer("pairs across the head, P2=D>R", config_from({{"rotary", {{"dim", 32}, {"pairing_dim", 64}}}}),
              scenario(50, 1, 9, 9));
  check_layer("MLA-style rope at the end",
              config_from({{"head_dim", 192},
                           {"query_heads", 4},
                           {"kv_heads", 2},
                           {"rotary", {{"offset", 128}, {"dim", 64}, {"pairing_dim", 2}}}}),
              scenario(40, 1, 0, 10));
  check_layer("linear x8",
              config_from({{"rotary", {{"theta", 1e6}, {"scaling", {{"type", "linear"}, {"factor", 8}}}}}}),
              scenario(60, 1, 2000, 11));
  check_layer("llama3",
              config_from({{"rotary",
                            {{"theta", 5e5},
                             {"scaling",
                              {{"type", "llama3"},
                               {"factor", 8},
                               {"low_freq_factor", 1},
                               {"high_freq_factor", 4},
                               {"original_max_position", 8192}}}}}}),
              scenario(60, 2, 9000, 12));
  check_layer(
      "yarn (gpt-oss)",
      config_from(
          {{"rotary",
            {{"theta", 150000},
             {"scaling",
              {{"type", "yarn"}, {"factor", 32}, {"original_max_position", 4096}, {"truncate", false}}}}}}),
      scenario(60, 1, 20000, 13));
  check_layer("no RoPE", config_from({{"rotary", {{"dim", 0}}}}), scenario(33, 1, 0, 14));
}

TEST_CASE(
    "q/k/v norms and RoPE in the q|k|v GEMM's epilogue, and in the postprocess kernel where it does not fit",
    "[gpu][layer][qkv_epilogue]") {
  // Llama-3.1-8B's shapes (rotate_half, D 128) on a narrow hidden size: 256-wide tiles from ~1k tokens
  // (fused), 192-wide ones for short chunks (heads split across tiles: the postprocess kernel).
  const nlohmann::json llama = {
      {"hidden_size", 1024}, {"query_heads", 32}, {"kv_heads", 8}, {"head_dim", 128}, {"max_tokens", 8192}};
  check_layer_path("Llama shapes, 1100 tokens", config_from(llama), scenario(1100, 3, 40, 50), true);
  check_layer_path("Llama shapes, 300 tokens", config_from(llama), scenario(300, 2, 17, 51), false);
  nlohmann::json qwen = llama;
  qwen["qkv_norm"] = {{"query", true}, {"key", true}, {"weight_offset", 1}};
  qwen["qkv_bias"] = true;
  qwen["rotary"] = {{"theta", 1e6},
                    {"scaling", {{"type", "yarn"}, {"factor", 4}, {"original_max_position", 4096}}}};
  check_layer_path("q/k norms (1 + w), biases, yarn", config_from(qwen), scenario(1100, 2, 3000, 52), true);
  // The default shapes (D 64, N 768): every tiling holds whole heads.
  check_layer_path("interleaved, v norm, partial rotary at an offset",
                   config_from({{"qkv_norm", {{"value", true}}},
                                {"rotary", {{"dim", 32}, {"pairing_dim", 2}, {"offset", 16}}}}),
                   scenario(333, 3, 9, 53), true);
  check_layer_path("half split of 16 (rotate_half of R 16)", config_from({{"rotary", {{"dim", 16}}}}),
                   scenario(129, 1, 0, 54), true);
  // A half split of 12 pairs dims 6 apart, across a quad's columns: the postprocess kernel.
  check_layer_path("half split of 12", config_from({{"rotary", {{"dim", 24}, {"pairing_dim", 12}}}}),
                   scenario(129, 1, 0, 55), false);
}

TEST_CASE("norms, biases, window, spans, softcap, sinks", "[gpu][layer][features]") {
  check_layer("q/k norm offset 0", config_from({{"qkv_norm", {{"query", true}, {"key", true}}}}),
              scenario(80, 2, 8, 15));
  check_layer("q/k norm offset 1, input norm offset 1",
              config_from({{"qkv_norm", {{"query", true}, {"key", true}, {"weight_offset", 1}}},
                           {"input_norm", {{"weight_offset", 1}, {"epsilon", 1e-6}}}}),
              scenario(80, 1, 0, 16));
  check_layer("v norm", config_from({{"qkv_norm", {{"value", true}}}}), scenario(50, 1, 0, 17));
  check_layer("biases", config_from({{"qkv_bias", true}, {"output_bias", true}}), scenario(50, 2, 3, 18));
  check_layer("fused qkv with bias", config_from({{"qkv_bias", true}, {"projection", {{"fused_qkv", true}}}}),
              scenario(50, 1, 0, 19));
  check_layer("window 1", config_from({{"sliding_window", 1}}), scenario(40, 1, 10, 20));
  check_layer("window 37", config_from({{"sliding_window", 37}}), scenario(300, 3, 100, 21));
  check_layer("spans", config_from({{"bidirectional_spans", true}}), scenario(150, 3, 20, 22));
  check_layer("spans on a sliding layer",
              config_from({{"bidirectional_spans", true}, {"sliding_window", 16}}), scenario(150, 2, 0, 23));
  // One span over each chunk (verify --mask bidirectional): execute orders the sequences longest first
  // for the sm_90a kernel's sequence-major walk (plan::longest_first_sequences), here 120, 90, 40, 10 keys
  // from the batch's order 40, 10, 90, 120, at D 128 and D 64.
  check::Scenario bidirectional = scenario(200, 4, 0, 41);
  bidirectional.chunk_lens = {40, 10, 60, 90};
  bidirectional.context_lens = {0, 0, 30, 30};
  bidirectional.bidirectional = true;
  check_layer("one span per chunk, D 128", config_from({{"bidirectional_spans", true}, {"head_dim", 128}}),
              bidirectional);
  check_layer("one span per chunk, D 64", config_from({{"bidirectional_spans", true}}), bidirectional);
  check_layer("softcap", config_from({{"softcap", 30.0}}), scenario(100, 1, 0, 24));
  check_layer("sinks", config_from({{"sinks", true}, {"sliding_window", 32}}), scenario(100, 2, 50, 25));
}

TEST_CASE("batches: 1 to 8 sequences, prefixes, block sizes, odd token counts", "[gpu][layer][batch]") {
  for (int block_size : {16, 32, 64}) {
    check_layer("block size " + std::to_string(block_size),
                config_from({{"kv_cache", {{"block_size", block_size}}}}),
                scenario(257, 5, 33, 26 + block_size));
  }
  check_layer("8 sequences", config_from({}), scenario(8 * 37 + 3, 8, 70, 30));
  check_layer("one token", config_from({}), scenario(1, 1, 500, 31));
  check_layer("block size 1", config_from({{"kv_cache", {{"block_size", 1}}}}), scenario(45, 2, 9, 32));
}

TEST_CASE("one sequence as one chunk or as two gives the same output and cache", "[gpu][layer][chunks]") {
  const config::AttentionConfig config = config_from({{"qkv_norm", {{"query", true}, {"key", true}}}});
  check::Scenario whole = scenario(150, 1, 0, 40);
  const check::LayerCase layer = check::random_case(config, whole);
  const plan::PrefillPlan plan = gpu().load(config);
  const check::DeviceWeights weights = check::upload_weights(config, layer.weights);
  const int hidden = config.hidden_size, tokens = layer.num_tokens();
  driver::DeviceBuffer input = driver::DeviceBuffer::from_host(layer.input);

  // Runs rows [first, first + count) as a chunk with context_len `first`, into the given pool and output.
  auto run = [&](int first, int count, driver::DeviceBuffer& keys, driver::DeviceBuffer& values,
                 driver::DeviceBuffer& output) {
    const check::DeviceBatch batch(
        reference::Batch{{0, count}, {first}, layer.batch.block_tables, layer.batch.max_blocks_per_seq}, {},
        config.bidirectional_spans);
    driver::DeviceBuffer workspace(plan.workspace_bytes(count));
    plan::ExecuteArgs args;
    args.input = static_cast<const char*>(input.data<const void>()) + std::size_t(first) * hidden * 2;
    args.output = static_cast<char*>(output.data<void>()) + std::size_t(first) * hidden * 2;
    args.weights = weights.view;
    args.cache = {keys.data<void>(), values.data<void>(), layer.num_blocks};
    args.batch = batch.description();
    args.workspace = workspace.data<void>();
    args.workspace_bytes = workspace.size_bytes();
    driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");
    plan.execute(args, nullptr);
    driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");
  };
  driver::DeviceBuffer keys_a = driver::DeviceBuffer::from_host(layer.key_cache);
  driver::DeviceBuffer values_a = driver::DeviceBuffer::from_host(layer.value_cache);
  driver::DeviceBuffer out_a(std::size_t(tokens) * hidden * 2);
  run(0, tokens, keys_a, values_a, out_a);
  driver::DeviceBuffer keys_b = driver::DeviceBuffer::from_host(layer.key_cache);
  driver::DeviceBuffer values_b = driver::DeviceBuffer::from_host(layer.value_cache);
  driver::DeviceBuffer out_b(std::size_t(tokens) * hidden * 2);
  run(0, 61, keys_b, values_b, out_b);
  run(61, tokens - 61, keys_b, values_b, out_b);
  CHECK(keys_a.download_all<std::uint16_t>() == keys_b.download_all<std::uint16_t>());
  CHECK(values_a.download_all<std::uint16_t>() == values_b.download_all<std::uint16_t>());
  const auto a = out_a.download_all<std::uint16_t>(), b = out_b.download_all<std::uint16_t>();
  // Attention over the same keys in another tile split may round differently in the last bit: compare values.
  std::vector<double> da(a.size()), db(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    da[i] = core::bf16_to_float(a[i]);
    db[i] = core::bf16_to_float(b[i]);
  }
  CHECK(reference::relative_l2_error(da, db) < 2e-3);
}

// fp8 activations: the quantize stages and the e4m3 GEMM inside the layer, every stage against the
// reference (which applies the same rounding; run_case compares the projections on the GPU's own stage
// input). Every weight scale granularity, a q/k/v bias and q/k norms (fused into the sm_90a GEMM's epilogue),
// M no tile multiple, the output projection alone, and on sm_90 the sm_89 mma.sync GEMM through a plan for
// plain sm_90. Skipped where plan_kernels refuses
// fp8 activations (no fp8 tensor cores on the device).
TEST_CASE("fp8 activations: quantize stages and the e4m3 GEMM in the layer", "[gpu][layer][fp8_activation]") {
  std::uint64_t seed = 300;
  for (const char* granularity : {"tensor", "channel", "block"}) {
    const nlohmann::json fp8 = {{"format", "fp8"}, {"scale_granularity", granularity}, {"activation", "fp8"}};
    const config::AttentionConfig config = config_from(
        {{"qkv_bias", true}, {"qkv_norm", {{"query", true}, {"key", true}}}, {"projection", fp8}});
    const config::Arch arch = gpu().runtime.resolve_arch(config);
    try {
      plan::plan_kernels(config, arch);
    } catch (const Error& error) {
      WARN("fp8 activations refused here: " << (error.details().empty() ? error.what() : error.details()[0]));
      return;
    }
    // On sm_90a the q/k norms, the bias and RoPE run in the e4m3 GEMM's epilogue (D 64: two heads a tile).
    check_layer_path(std::string("fp8 activations, ") + granularity + " weight scales", config,
                     scenario(301, 3, 40, seed++), arch.arch_specific && arch.sm() == 90);
  }
  nlohmann::json output_only = {{"format", "bf16"}};
  output_only["output"] = {{"format", "fp8"}, {"scale_granularity", "block"}, {"activation", "fp8"}};
  check_layer("fp8 activations, output projection only", config_from({{"projection", output_only}}),
              scenario(130, 1, 0, seed++));
  // The sm_89 GEMM (mma.sync e4m3) inside the layer: a plan for plain sm_90 picks it and loads on sm_90a.
  if (gpu().runtime.resolve_arch(config_from({})).sm() == 90) {
    const nlohmann::json fp8 = {{"format", "fp8"}, {"scale_granularity", "block"}, {"activation", "fp8"}};
    const config::AttentionConfig config =
        config_from({{"qkv_bias", true}, {"projection", fp8}, {"target", {{"arch", "sm_90"}}}});
    REQUIRE(plan::plan_kernels(config, *config.target.arch).qkv_projection_fp8->kernel ==
            plan::GemmFp8Kernel::mma_sync);
    check_layer("fp8 activations, mma.sync e4m3 GEMM (plan for plain sm_90)", config,
                scenario(301, 3, 40, seed++));
  }
}

TEST_CASE("every plan in plans/ verifies", "[gpu][layer][plans]") {
  std::vector<std::filesystem::path> files;
  for (const auto& file :
       std::filesystem::directory_iterator(std::filesystem::path(ATTNPLAN_SOURCE_DIR) / "plans")) {
    if (file.path().extension() == ".json") files.push_back(file.path());
  }
  std::sort(files.begin(), files.end());
  int verified = 0;
  for (const auto& file : files) {
    const config::AttentionConfig config = config::load_file(file);
    // A format whose kernel is not written yet is refused at planning with Error(config) naming the field;
    // that refusal is the expected outcome for it (reported, not verified).
    try {
      plan::plan_kernels(config, gpu().runtime.resolve_arch(config));
    } catch (const Error& error) {
      const bool not_yet = error.stage() == Stage::config && !error.details().empty() &&
                           error.details()[0].find("not supported by the kernels yet") != std::string::npos;
      if (!not_yet) throw;
      WARN(file.filename().string() << ": refused at planning: " << error.details()[0]);
      continue;
    }
    check_layer(file.filename().string(), config, scenario(300, 3, 64, 50));
    ++verified;
  }
  CHECK(verified >= 14);
}

TEST_CASE("execute captured in a CUDA graph replays the direct result", "[gpu][layer][graph]") {
  const config::AttentionConfig config = config_from({{"qkv_bias", true}, {"sliding_window", 50}});
  const check::LayerCase layer = check::random_case(config, scenario(120, 3, 20, 60));
  const plan::PrefillPlan plan = gpu().load(config);
  DeviceCase device(plan, layer);
  driver::Stream stream = driver::Stream::create();

  device.output.fill_bytes_async(kPoisonByte, stream.handle());
  plan.execute(device.args, stream.handle());
  stream.synchronize();
  const auto direct = device.output.download_all<std::uint16_t>();
  const auto direct_keys = device.keys.download_all<std::uint16_t>();

  const driver::CudaApi& cu = driver::api();
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  driver::check(cu.cuStreamBeginCapture(stream.handle(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture");
  plan.execute(device.args, stream.handle());
  driver::check(cu.cuStreamEndCapture(stream.handle(), &graph), "cuStreamEndCapture");
  driver::check(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiateWithFlags");
  for (int replay = 0; replay < 2; ++replay) {
    device.output.fill_bytes_async(kPoisonByte, stream.handle());
    driver::check(cu.cuGraphLaunch(exec, stream.handle()), "cuGraphLaunch");
    stream.synchronize();
    CHECK(device.output.download_all<std::uint16_t>() == direct);
    CHECK(device.keys.download_all<std::uint16_t>() == direct_keys);
  }
  driver::check(cu.cuGraphExecDestroy(exec), "cuGraphExecDestroy");
  driver::check(cu.cuGraphDestroy(graph), "cuGraphDestroy");
}

// Rejected inputs (every field execute() checks): reliability_gpu_test.cpp.

TEST_CASE("a plan with the attention trace computes what the plan without it does", "[gpu][layer][trace]") {
  // The traced specialization (`attnplan bench --trace-attention`) at each head dim's schedule: D 64's
  // three consumer warpgroups, D 128's overlapped softmax, D 256's ping-pong; causal with a prefix, and one
  // span per chunk (D <= 128: the split tail's specialization, traced too).
  RuntimeOptions options = gpu().runtime.options();
  options.trace_attention = true;
  Runtime traced(options);
  for (int head_dim : {64, 128, 256}) {
    const config::AttentionConfig config =
        config_from({{"head_dim", head_dim}, {"value_head_dim", head_dim}, {"bidirectional_spans", true}});
    const plan::PrefillPlan plan = traced.load(traced.compile(config));
    REQUIRE(plan.compiled().kernels_planned.attention.traces);
    CHECK(plan.workspace_layout(300).attention_trace_bytes == static_cast<std::size_t>(kAttentionTraceBytes));
    check::Scenario causal = scenario(300, 3, 40, 60 + head_dim);
    check::Scenario bidirectional = scenario(300, 2, 0, 61 + head_dim);
    bidirectional.bidirectional = true;
    for (const check::Scenario& batch : {causal, bidirectional}) {
      INFO("D " << head_dim << (batch.bidirectional ? " bidirectional" : " causal"));
      check_plan(plan, config, batch);
    }
  }
}
