// The dequantized path of weight-only quantized projections (gemm_spec.hpp's choose_dequantized_gemm,
// kernel_plan.hpp, prefill_plan.hpp's plan_workspace): on sm_90a, a plan built for long launches also
// compiles the dequantize kernel and the bf16 wgmma GEMM, and launches of the path's min_tokens rows or
// more take them, with W [N, K] bf16 in the workspace.
#include <algorithm>
#include <string>
#include <vector>

#include "config/parse.hpp"
#include "core/error.hpp"
#include "plan/kernel_plan.hpp"
#include "plan/prefill_plan.hpp"
#include "plan_testing.hpp"
#include "support/catch.hpp"
#include "support/weight_encodings.hpp"

using namespace attnplan;

namespace {

const config::Arch kSm90a{9, 0, true};

// The message of the Error `check` throws ("" when it does not throw).
template <class Check>
std::string error_of(Check check) {
  try {
    check();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

config::AttentionConfig plan_config(const std::string& name) {
  return config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/" + name + ".json");
}

std::vector<std::string> names_of(const plan::KernelPlan& kernels) {
  std::vector<std::string> names;
  for (const plan::PlannedKernel& kernel : kernels.kernels) names.push_back(kernel.name);
  return names;
}

}  // namespace

TEST_CASE("on sm_90a weight-only quantized projections plan a dequantized path into the bf16 GEMM",
          "[plan][gemm][dequantized]") {
  const config::AttentionConfig bf16 = plan_config("llama-3.1-8b");
  const plan::KernelPlan bf16_kernels = plan::plan_kernels(bf16, kSm90a);
  CHECK_FALSE(bf16_kernels.qkv_projection_dequantized);
  CHECK_FALSE(bf16_kernels.output_projection_dequantized);

  // Every weight-only format of plans/, act-order GPTQ included (its mma.sync loader reads g_idx).
  for (const char* name :
       {"llama-3.1-8b-gptq", "llama-3.1-8b-awq", "llama-3.1-8b-nvfp4", "llama-3.1-8b-mxfp8",
        "llama-3.1-8b-mlx-4bit", "llama-3.1-8b-fp8", "qwen3-8b-fp8-block"}) {
    INFO(name);
    const config::AttentionConfig config = plan_config(name);
    const plan::KernelPlan kernels = plan::plan_kernels(config, kSm90a);
    REQUIRE(kernels.qkv_projection_dequantized);
    REQUIRE(kernels.output_projection_dequantized);
    const plan::KernelPlan::Dequantized& qkv = *kernels.qkv_projection_dequantized;
    const plan::KernelPlan::Dequantized& output = *kernels.output_projection_dequantized;
    // The format's switch point, or the decoding kernel's one wave (both Llama-3.1-8B projections: 513).
    const bool decoded = plan::sm90_decode_gemm_planned(config.projection.qkv);
    CHECK(qkv.min_tokens == (decoded ? 513 : plan::dequantized_min_tokens(config.projection.qkv)));
    CHECK(output.min_tokens == qkv.min_tokens);
    const int min_tokens = qkv.min_tokens;
    REQUIRE(config.max_tokens >= min_tokens);
    CHECK(qkv.dequantize.weights == config.projection.qkv);
    CHECK(qkv.dequantize.segments == kernels.qkv_projection.segments);
    CHECK(qkv.gemm.kernel == plan::GemmKernel::wgmma);
    CHECK(qkv.gemm.weights.format == config::WeightFormat::bf16);
    // The same bf16 wgmma kernels a bf16 Llama-3.1-8B plan runs (one cache entry serves both), but for the
    // q|k|v epilogue's postprocess where the norms differ (Qwen3's q/k norms).
    REQUIRE(qkv.gemm.postprocess);
    const bool same_postprocess =
        qkv.gemm.postprocess->epilogue_traits() == bf16_kernels.qkv_projection.postprocess->epilogue_traits();
    if (config.hidden_size == bf16.hidden_size && config.query_heads == bf16.query_heads) {
      if (same_postprocess)
        CHECK(qkv.gemm.source().render_stub() == bf16_kernels.qkv_projection.source().render_stub());
      CHECK(kernels.output_projection_dequantized->gemm.source().render_stub() ==
            bf16_kernels.output_projection.source().render_stub());
    }
    const std::string stub = qkv.dequantize.source().render_stub();
    CHECK(stub.find("#include \"attnplan/dequantize.cuh\"") != std::string::npos);
    // Act-order GPTQ (K 4096: 32 groups of 128) stages its groups in the group table; the rest, tiles.
    const bool table = config.projection.qkv.act_order;
    CHECK(stub.find(table ? "dequantize_table_kernel" : "dequantize_kernel") != std::string::npos);
    CHECK(qkv.dequantize.kernel ==
          (table ? plan::DequantizeKernel::group_table : plan::DequantizeKernel::tiles));
    CHECK(qkv.dequantize.groups == (table ? 32 : 0));
    CHECK(output.dequantize.kernel == qkv.dequantize.kernel);

    // Each projection's two kernels right after its planned kernel (and its short-launch specialization,
    // the decoding kernel's for the 4-bit formats), in the projection's stage. Where the path takes every
    // launch (min_tokens 1: act-order GPTQ), the planned kernels never run and are not compiled.
    std::vector<std::string> names = names_of(kernels);
    const auto position = [&](std::string_view kernel) {
      return std::find(names.begin(), names.end(), kernel) - names.begin();
    };
    const bool planned_runs = min_tokens > 1;
    CHECK(planned_runs == !config.projection.qkv.act_order);
    CHECK((position("qkv_projection") < std::ptrdiff_t(names.size())) == planned_runs);
    CHECK((position("output_projection") < std::ptrdiff_t(names.size())) == planned_runs);
    const int small = (kernels.qkv_projection_small ? 1 : 0) + (kernels.qkv_projection_tiny ? 1 : 0);
    CHECK(kernels.qkv_projection_small.has_value() == plan::sm90_decode_gemm_planned(config.projection.qkv));
    const std::ptrdiff_t path = position("input_rmsnorm") + 1 + (planned_runs ? 1 + small : 0);
    CHECK(position(plan::kQkvDequantizeName) == path);
    CHECK(position(plan::kQkvProjectionDequantizedName) == path + 1);
    // The path's short-launch GEMM (the bf16 plan's kSmallLaunchTokens tiling, where it differs: on
    // Llama-3.1-8B's shapes it does), last.
    CHECK(qkv.gemm_small.has_value() == bf16_kernels.qkv_projection_small.has_value());
    CHECK(output.gemm_small.has_value() == bf16_kernels.output_projection_small.has_value());
    if (qkv.gemm_small) {
      CHECK(position(plan::kQkvProjectionDequantizedSmallName) == path + 2);
      CHECK(position(plan::kOutputProjectionDequantizedSmallName) == std::ptrdiff_t(names.size()) - 1);
      CHECK(position(plan::kOutputProjectionDequantizedName) == std::ptrdiff_t(names.size()) - 2);
      if (config.hidden_size == bf16.hidden_size && config.query_heads == bf16.query_heads) {
        REQUIRE(bf16_kernels.qkv_projection_small);
        REQUIRE(bf16_kernels.output_projection_small);
        CHECK(qkv.gemm_small->source().render_stub() ==
              bf16_kernels.qkv_projection_small->source().render_stub());
        CHECK(output.gemm_small->source().render_stub() ==
              bf16_kernels.output_projection_small->source().render_stub());
      }
    } else {
      CHECK(position(plan::kOutputProjectionDequantizedName) == std::ptrdiff_t(names.size()) - 1);
    }
    for (const plan::PlannedKernel& kernel : kernels.kernels) {
      const plan::ProjectionVariant variant = plan::projection_variant_of(kernel);
      if (kernel.name == plan::kQkvDequantizeName || kernel.name == plan::kOutputDequantizeName) {
        CHECK(variant == plan::ProjectionVariant::dequantize);
        CHECK(kernel.dynamic_shared_bytes == qkv.dequantize.dynamic_shared_bytes());
        CHECK(kernel.dynamic_shared_bytes == (table ? dequantize_table_shared_bytes(32, 4) : 0));
      }
      if (kernel.name == plan::kQkvProjectionDequantizedName) {
        CHECK(variant == plan::ProjectionVariant::dequantized);
        CHECK(kernel.stage == plan::StageKind::qkv_projection);
        CHECK(kernel.dynamic_shared_bytes == qkv.gemm.dynamic_shared_bytes());
      }
      if (kernel.name == plan::kOutputProjectionDequantizedSmallName) {
        CHECK(variant == plan::ProjectionVariant::dequantized_small);
        CHECK(kernel.stage == plan::StageKind::output_projection);
        REQUIRE(output.gemm_small);
        CHECK(kernel.dynamic_shared_bytes == output.gemm_small->dynamic_shared_bytes());
      }
    }

    // Launches from min_tokens rows take it, and the workspace then holds the larger W.
    CHECK_FALSE(plan::runs_dequantized(kernels.qkv_projection_dequantized, min_tokens - 1));
    CHECK(plan::runs_dequantized(kernels.qkv_projection_dequantized, min_tokens));
    const long long qkv_weight = plan::qkv_row_width(config) * config.hidden_size;
    const long long output_weight =
        static_cast<long long>(config.hidden_size) * config.query_heads * config.value_head_dim;
    const plan::WorkspaceLayout short_launch = plan::plan_workspace(config, kernels, min_tokens - 1);
    CHECK(short_launch.dequantized_weight_bytes == 0);
    CHECK(short_launch.attention_partials_bytes == 0);  // a causal plan: no split tail
    // and the attention's counters
    CHECK(short_launch.bytes == short_launch.dequantized_weights + plan::kAttentionCounterBytes);
    const plan::WorkspaceLayout long_launch = plan::plan_workspace(config, kernels, min_tokens);
    CHECK(long_launch.dequantized_weight_bytes == std::size_t(std::max(qkv_weight, output_weight)) * 2);
    CHECK(long_launch.dequantized_weights % 256 == 0);
    CHECK(long_launch.dequantized_weights >= long_launch.fp8_activations + long_launch.fp8_activation_bytes);
    CHECK(long_launch.attention_items ==
          long_launch.dequantized_weights + long_launch.dequantized_weight_bytes);
    CHECK(long_launch.bytes == long_launch.attention_items + plan::kAttentionCounterBytes);
  }
}

TEST_CASE("the dequantized path is planned only on sm_90a, for long launches, without fp8 activations",
          "[plan][gemm][dequantized]") {
  config::AttentionConfig config = plan_config("llama-3.1-8b-nvfp4");
  // Other archs keep the quantized kernels at every length (the path is measured on the H200 only).
  for (const config::Arch arch :
       {config::Arch{8, 0, false}, config::Arch{8, 9, false}, config::Arch{9, 0, false}}) {
    const plan::KernelPlan kernels = plan::plan_kernels(config, arch);
    CHECK_FALSE(kernels.qkv_projection_dequantized);
    CHECK_FALSE(kernels.output_projection_dequantized);
    CHECK(plan::plan_workspace(config, kernels, config.max_tokens).dequantized_weight_bytes == 0);
  }
  // A plan that never launches the path's min_tokens rows does not compile it.
  const int min_tokens = plan::plan_kernels(config, kSm90a).qkv_projection_dequantized->min_tokens;
  config.max_tokens = min_tokens - 1;
  CHECK_FALSE(plan::plan_kernels(config, kSm90a).qkv_projection_dequantized);
  config.max_tokens = min_tokens;
  CHECK(plan::plan_kernels(config, kSm90a).qkv_projection_dequantized);
  // fp8 activations run their own e4m3 GEMM.
  const config::AttentionConfig fp8_activations = plan_config("qwen3-8b-fp8-block-fp8act");
  const plan::KernelPlan fp8_kernels = plan::plan_kernels(fp8_activations, kSm90a);
  CHECK_FALSE(fp8_kernels.qkv_projection_dequantized);
  CHECK_FALSE(fp8_kernels.output_projection_dequantized);
}

TEST_CASE(
    "the dequantized path starts at one row for mma.sync formats, 512 where wgmma_w4 is slowest, else 1024",
    "[plan][gemm][dequantized]") {
  using config::PackedIntegerScheme;
  const auto packed = testing::packed_encoding;
  const auto format = [](config::WeightFormat each) {
    config::WeightEncoding encoding;
    encoding.format = each;
    return encoding;
  };
  // mma.sync for short launches (no wgmma_w4 member): 2.7-5.8x behind the path from 1 to 511 rows.
  for (const config::WeightEncoding& weights :
       {packed(PackedIntegerScheme::gptq, 4, 128, true), packed(PackedIntegerScheme::gptq_v2, 8, 32, true),
        testing::affine_encoding(3, 32)}) {
    CHECK(plan::dequantized_min_tokens(weights) == 1);
  }
  // A wgmma_w4 member behind the path at 512 rows (nvfp4, mxfp4, AWQ: the H200's measurements in
  // gemm_spec.hpp).
  for (const config::WeightEncoding& weights :
       {format(config::WeightFormat::nvfp4), format(config::WeightFormat::mxfp4),
        packed(PackedIntegerScheme::awq, 4, 128, false)}) {
    CHECK(plan::dequantized_min_tokens(weights) == 512);
  }
  // wgmma_w4 ties or wins at 512 rows.
  for (const config::WeightEncoding& weights :
       {packed(PackedIntegerScheme::gptq, 4, 128, false), testing::affine_encoding(4, 64),
        format(config::WeightFormat::mxfp8), format(config::WeightFormat::fp8)}) {
    CHECK(plan::dequantized_min_tokens(weights) == 1024);
  }
  // The act-order GPTQ and AWQ plans launch 600 rows on the path, the mxfp8 plan does not.
  const config::AttentionConfig gptq_config = plan_config("llama-3.1-8b-gptq");
  const plan::KernelPlan gptq = plan::plan_kernels(gptq_config, kSm90a);
  CHECK(plan::runs_dequantized(gptq.qkv_projection_dequantized, 600));
  // The act-order plan from one row: its workspace holds W at any launch length.
  CHECK(plan::runs_dequantized(gptq.qkv_projection_dequantized, 1));
  CHECK(plan::runs_dequantized(gptq.output_projection_dequantized, 1));
  CHECK_FALSE(plan::runs_dequantized(gptq.qkv_projection_dequantized, 0));
  CHECK(plan::plan_workspace(gptq_config, gptq, 1).dequantized_weight_bytes ==
        std::size_t(plan::qkv_row_width(gptq_config)) * gptq_config.hidden_size * 2);
  const plan::KernelPlan awq = plan::plan_kernels(plan_config("llama-3.1-8b-awq"), kSm90a);
  CHECK(plan::runs_dequantized(awq.qkv_projection_dequantized, 600));
  const plan::KernelPlan mxfp8 = plan::plan_kernels(plan_config("llama-3.1-8b-mxfp8"), kSm90a);
  CHECK_FALSE(plan::runs_dequantized(mxfp8.qkv_projection_dequantized, 600));
}

TEST_CASE("projections on the decoding kernel take the dequantized path past one wave of tiles",
          "[plan][gemm][dequantized][gemm_decode]") {
  using plan::decode_dequantized_min_tokens;
  using plan::gemm_sm90_decode_tiling;
  // 32 column tiles in pairs of row tiles: 4 row tiles (128 CTAs) fit 132 SMs.
  CHECK(decode_dequantized_min_tokens(gemm_sm90_decode_tiling(128, 4, 2), 4096, 132) == 513);
  CHECK(decode_dequantized_min_tokens(gemm_sm90_decode_tiling(192, 4, 2), 6144, 132) == 513);
  // 23 column tiles: 5 row tiles fit unclustered, 4 in pairs (a wave holds whole clusters).
  CHECK(decode_dequantized_min_tokens(gemm_sm90_decode_tiling(128, 4, 1), 2880, 132) == 641);
  CHECK(decode_dequantized_min_tokens(gemm_sm90_decode_tiling(128, 4, 2), 2880, 132) == 513);
  // Clamped to [512, 1024]: wide N (54 column tiles: 2 row tiles a wave), narrow N (8: 16 row tiles).
  CHECK(decode_dequantized_min_tokens(gemm_sm90_decode_tiling(192, 4, 2), 10240, 132) == 512);
  CHECK(decode_dequantized_min_tokens(gemm_sm90_decode_tiling(128, 4, 2), 1024, 132) == 1024);
  // Fewer SMs, fewer rows in a wave.
  CHECK(decode_dequantized_min_tokens(gemm_sm90_decode_tiling(128, 4, 2), 1024, 66) == 1024);
  CHECK(decode_dequantized_min_tokens(gemm_sm90_decode_tiling(128, 4, 2), 2048, 66) == 513);
  CHECK(decode_dequantized_min_tokens(gemm_sm90_decode_tiling(128, 4, 2), 4096, 66) == 512);

  // The plans: Llama-3.1-8B nvfp4 and MLX 4-bit launch 512 rows on the decoding kernel and 513 on the
  // path (MLX's format rule said 1024), gpt-oss-20b mxfp4 likewise for both projections.
  for (const char* name : {"llama-3.1-8b-nvfp4", "llama-3.1-8b-mlx-4bit", "gpt-oss-20b-mxfp4"}) {
    INFO(name);
    const plan::KernelPlan kernels = plan::plan_kernels(plan_config(name), kSm90a);
    REQUIRE(kernels.qkv_projection.kernel == plan::GemmKernel::wgmma_decode);
    REQUIRE(kernels.output_projection.kernel == plan::GemmKernel::wgmma_decode);
    for (const auto* path : {&kernels.qkv_projection_dequantized, &kernels.output_projection_dequantized}) {
      CHECK_FALSE(plan::runs_dequantized(*path, 512));
      CHECK(plan::runs_dequantized(*path, 513));
    }
  }
}

TEST_CASE("the dequantize kernel's spec: stub, launch shape and checks", "[plan][gemm][dequantized]") {
  plan::DequantizeSpec spec;
  spec.segments = 3;
  spec.weights.format = config::WeightFormat::nvfp4;
  const std::string stub = spec.source().render_stub();
  CHECK(stub.find("Nvfp4Weights") != std::string::npos);
  CHECK(stub.find("/*segments=*/3") != std::string::npos);
  const driver::LaunchShape shape = spec.launch_shape(6144, 4096);
  CHECK(shape.grid.x == 6144 / kDequantizeBlockRows);
  CHECK(shape.grid.y == 4096 / kDequantizeBlockK);
  CHECK(shape.block.x == unsigned(kDequantizeThreads));
  CHECK(spec.launch_shape(65, 72).grid.x == 2);
  CHECK(spec.launch_shape(65, 72).grid.y == 2);
  CHECK_THROWS_AS(spec.launch_shape(0, 64), Error);
  plan::DequantizeSpec bf16;
  CHECK_THROWS_AS(bf16.source(), Error);  // nothing to dequantize

  // Params: the quantized GEMM's rules, and W's destination.
  alignas(256) static unsigned char memory[4096];
  DequantizeParams params{};
  params.gemm.a = reinterpret_cast<const bf16_bits*>(memory);
  params.gemm.c = reinterpret_cast<bf16_bits*>(memory);
  params.gemm.lda = 64;
  params.gemm.ldc = 192;
  params.gemm.m = 1;
  params.gemm.n = 192;
  params.gemm.k = 64;
  for (int s = 0; s < 3; ++s) {
    params.gemm.segments[s] = {reinterpret_cast<const bf16_bits*>(memory), nullptr, 64 * s, 64 * (s + 1)};
    params.gemm.segments[s].scales = memory;
    params.gemm.segments[s].scale_2 = reinterpret_cast<const float*>(memory);
  }
  params.weight = reinterpret_cast<bf16_bits*>(memory + 256);
  CHECK_NOTHROW(spec.check(params));
  params.weight = reinterpret_cast<bf16_bits*>(memory + 8);
  CHECK(error_of([&] { spec.check(params); }).find("dequantize weight") != std::string::npos);
  params.weight = reinterpret_cast<bf16_bits*>(memory + 256);
  params.gemm.segments[1].scales = nullptr;
  CHECK(error_of([&] { spec.check(params); }).find("segments[1].scales") != std::string::npos);
}

TEST_CASE("act-order GPTQ dequantizes through a group table where K's groups and the segments allow",
          "[plan][gemm][dequantized]") {
  using config::PackedIntegerScheme;
  const config::WeightEncoding act_order = testing::packed_encoding(PackedIntegerScheme::gptq, 4, 128, true);
  const std::vector<int> llama = {4096, 1024, 1024};

  // Llama-3.1-8B: K 4096, 32 groups; 34 KiB of shared memory (16 KiB table, 16 KiB words, 2 KiB offsets).
  const plan::DequantizeSpec spec = plan::choose_dequantize(3, act_order, 4096, llama);
  CHECK(spec.kernel == plan::DequantizeKernel::group_table);
  CHECK(spec.groups == 32);
  CHECK(spec.dynamic_shared_bytes() == 32 * 64 * 8 + 64 * 64 * 4 + 512 * 4);
  const std::string stub = spec.source().render_stub();
  CHECK(stub.find("DequantizeTableTraits") != std::string::npos);
  CHECK(stub.find("GptqWeights<4, false, 128, true>") != std::string::npos);
  CHECK(stub.find("/*groups=*/32") != std::string::npos);
  const driver::LaunchShape shape = spec.launch_shape(6144, 4096);
  CHECK(shape.grid.x == 96);
  CHECK(shape.grid.y == 8);
  CHECK(shape.block.x == unsigned(kDequantizeThreads));
  CHECK(shape.dynamic_shared_bytes == unsigned(spec.dynamic_shared_bytes()));
  CHECK(spec.launch_shape(6144, 2944).grid.y == 6);  // a partial last K block
  // 8-bit words hold 4 k: 128 word rows.
  const config::WeightEncoding act_order_8 =
      testing::packed_encoding(PackedIntegerScheme::gptq_v2, 8, 32, true);
  CHECK(plan::choose_dequantize(1, act_order_8, 2912, std::vector<int>{1480}).dynamic_shared_bytes() ==
        91 * 512 + 128 * 64 * 4 + 512 * 4);
  // Per channel: one group.
  const config::WeightEncoding per_channel = testing::packed_encoding(PackedIntegerScheme::gptq, 4, -1, true);
  CHECK(plan::choose_dequantize(3, per_channel, 4096, llama).groups == 1);

  // The tiles kernel otherwise: no act order, a segment boundary inside a 64-row block, too many groups.
  CHECK(plan::choose_dequantize(3, testing::packed_encoding(PackedIntegerScheme::gptq, 4, 128, false), 4096,
                                llama)
            .kernel == plan::DequantizeKernel::tiles);
  CHECK(plan::choose_dequantize(3, testing::packed_encoding(PackedIntegerScheme::awq, 4, 128, false), 4096,
                                llama)
            .kernel == plan::DequantizeKernel::tiles);
  CHECK(plan::choose_dequantize(3, act_order, 4096, std::vector<int>{992, 224, 200}).kernel ==
        plan::DequantizeKernel::tiles);
  CHECK(plan::choose_dequantize(3, act_order, 4096, std::vector<int>{1024, 256, 200}).kernel ==
        plan::DequantizeKernel::group_table);  // the last segment may end anywhere
  const config::WeightEncoding small_groups =
      testing::packed_encoding(PackedIntegerScheme::gptq, 4, 32, true);
  CHECK(plan::choose_dequantize(1, small_groups, 32 * plan::kDequantizeTableMaxGroups, std::vector<int>{4096})
            .kernel == plan::DequantizeKernel::group_table);
  CHECK(plan::choose_dequantize(1, small_groups, 32 * plan::kDequantizeTableMaxGroups + 32,
                                std::vector<int>{4096})
            .kernel == plan::DequantizeKernel::tiles);

  // Params: K must have the table's groups, and segments must begin on 64-row blocks.
  DequantizeParams params{};
  params.gemm = plan_testing::llama_qkv_params(1);
  for (int s = 0; s < 3; ++s) {
    params.gemm.segments[s].zeros = plan_testing::fake_pointer<const void>(0x8000000);
    params.gemm.segments[s].g_idx = plan_testing::fake_pointer<const int>(0x9000000);
  }
  params.weight = plan_testing::fake_pointer<bf16_bits>(0xA000000);
  CHECK_NOTHROW(spec.check(params));
  params.gemm.k = 4224;  // 33 groups
  params.gemm.lda = 4224;
  CHECK(error_of([&] {
          spec.check(params);
        }).find("dequantize: K = 4224 has 33 groups of 128, the group table was compiled for 32") !=
        std::string::npos);
  params.gemm.k = 4096;
  params.gemm.lda = 4096;
  params.gemm.segments[0].n_end = params.gemm.segments[1].n_begin = 4064;
  CHECK(error_of([&] { spec.check(params); })
            .find("dequantize: segments[1] begins at row 4064, not a multiple of 64 (the group table's CTAs "
                  "take one segment's rows)") != std::string::npos);

  // A group table for a format that does not gather groups, or of no groups, is refused.
  plan::DequantizeSpec wrong = spec;
  wrong.weights = testing::packed_encoding(PackedIntegerScheme::gptq, 4, 128, false);
  CHECK(error_of([&] { (void)wrong.source(); }).find("no group table of 32 groups") != std::string::npos);
  wrong = spec;
  wrong.groups = 0;
  CHECK_THROWS_AS(wrong.source(), Error);
}

TEST_CASE("a dequantized launch takes the path's short-launch GEMM where it costs less",
          "[plan][gemm][dequantized]") {
  using plan::ProjectionVariant;
  // Act-order GPTQ on Llama-3.1-8B: the path from one token, its GEMMs tiled for 8192 rows (128 x 256:
  // 24 column tiles of q|k|v, 16 of o) and for 512.
  const config::AttentionConfig config = plan_config("llama-3.1-8b-gptq");
  const plan::KernelPlan kernels = plan::plan_kernels(config, kSm90a);
  REQUIRE(kernels.qkv_projection_dequantized);
  REQUIRE(kernels.qkv_projection_dequantized->gemm_small);
  REQUIRE(kernels.output_projection_dequantized);
  REQUIRE(kernels.output_projection_dequantized->gemm_small);
  const plan::KernelPlan::Dequantized& qkv = *kernels.qkv_projection_dequantized;
  CHECK(qkv.gemm.sm90.block_n == 256);
  CHECK(qkv.gemm_small->sm90.block_n < qkv.gemm.sm90.block_n);
  const int qkv_n = static_cast<int>(plan::qkv_row_width(config));
  const int hidden = config.hidden_size;
  const auto variant = [&](plan::StageKind stage, int tokens) {
    return plan::launched_projection_variant(kernels, stage, tokens,
                                             stage == plan::StageKind::qkv_projection ? qkv_n : hidden, 132);
  };
  for (const plan::StageKind stage : {plan::StageKind::qkv_projection, plan::StageKind::output_projection}) {
    INFO(plan::to_string(stage));
    // One row tile: more, narrower tiles fill more SMs.
    CHECK(variant(stage, 1) == ProjectionVariant::dequantized_small);
    CHECK(variant(stage, 512) == ProjectionVariant::dequantized_small);
    // Whole waves of 128 x 256 tiles at 8192 rows.
    CHECK(variant(stage, 8192) == ProjectionVariant::dequantized);
  }
  // Each matches choose_gemm_variant on the path's two tilings.
  for (const int tokens : {1, 64, 256, 384, 512, 640, 1024, 2048, 4096, 8192}) {
    INFO(tokens);
    const bool small =
        plan::choose_gemm_variant(tokens, qkv_n, qkv.gemm.sm90, qkv.gemm_small->sm90, 132).small;
    CHECK(variant(plan::StageKind::qkv_projection, tokens) ==
          (small ? ProjectionVariant::dequantized_small : ProjectionVariant::dequantized));
  }
  // A plan whose path starts past the decoding kernel's one wave (513 tokens) has one too, for the
  // launches whose tiles round badly: q|k|v's 120 tiles of 128 x 256 at 600 tokens are one round on 132
  // SMs (160 of 128 x 192 would be two), its 144 at 768 tokens two, as the narrower tiles' 192; o's 80 of
  // 128 x 256 at 600 tokens are one round, 160 of 128 x 128 two.
  const plan::KernelPlan awq = plan::plan_kernels(plan_config("llama-3.1-8b-awq"), kSm90a);
  REQUIRE(awq.qkv_projection_dequantized);
  REQUIRE(awq.qkv_projection_dequantized->gemm_small);
  REQUIRE(awq.output_projection_dequantized->gemm_small);
  CHECK(plan::launched_projection_variant(awq, plan::StageKind::output_projection, 600, hidden, 132) ==
        ProjectionVariant::dequantized);
  CHECK(plan::launched_projection_variant(awq, plan::StageKind::qkv_projection, 600, qkv_n, 132) ==
        ProjectionVariant::dequantized);
  CHECK(plan::launched_projection_variant(awq, plan::StageKind::qkv_projection, 768, qkv_n, 132) ==
        ProjectionVariant::dequantized_small);
  CHECK(plan::launched_projection_variant(awq, plan::StageKind::qkv_projection, 8192, qkv_n, 132) ==
        ProjectionVariant::dequantized);
}
