// The sm_90a decoding GEMM (gemm_sm90_decode.cuh, GemmKernel::wgmma_decode): which formats and shapes
// choose_decode_gemm_kernel gives it, its ring (gemm_sm90_decode_tiling), stub, launch shape and checks, and
// NVRTC compiles of every specialization for sm_90a (no spills, no serialized wgmma).
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "compiler/compiler.hpp"
#include "core/error.hpp"
#include "plan/gemm_spec.hpp"
#include "plan_testing.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/weight_encodings.hpp"

using namespace attnplan;
using namespace attnplan::plan;
using plan_testing::fake_pointer;
using plan_testing::llama_qkv_params;
constexpr auto format = plan_testing::weight_format;
using plan_testing::kSm80;
using plan_testing::kSm90a;

namespace {

config::WeightEncoding awq(int group_size) {
  return testing::packed_encoding(config::PackedIntegerScheme::awq, 4, group_size, false);
}

// Every encoding the kernel reads: codes in rows of bytes, 4 or 8 bits, AWQ's words and GPTQ's.
std::vector<config::WeightEncoding> decode_encodings() {
  std::vector<config::WeightEncoding> encodings = {
      format(config::WeightFormat::mxfp4),
      format(config::WeightFormat::nvfp4),
      testing::affine_encoding(4, 32),
      testing::affine_encoding(4, 64),
      testing::affine_encoding(4, 128),
      awq(128),
      awq(-1),
      testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 128, false),
      testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 32, false),
      testing::packed_encoding(config::PackedIntegerScheme::gptq_v2, 4, -1, false)};
  for (const config::WeightEncoding& encoding : testing::sm90_w8_encodings()) encodings.push_back(encoding);
  return encodings;
}

bool eight_bit(const config::WeightEncoding& encoding) {
  return encoding.format == config::WeightFormat::fp8 || encoding.format == config::WeightFormat::mxfp8;
}

}  // namespace

TEST_CASE("wgmma_decode: sm_90a, codes in rows of bytes, the bf16 kernel's tiles",
          "[plan][gemm][gemm_decode]") {
  const int llama[] = {4096, 1024, 1024};
  for (const config::WeightEncoding& encoding : decode_encodings()) {
    INFO(config::to_string(encoding.format) << " group " << encoding.group_size);
    CHECK(sm90_decode_gemm_supports(encoding));
    // The bf16 kernel's cost model over 192, 160 and 128: 192 for N 6144 at 8k tokens (as at 512).
    const GemmKernelChoice long_launch = choose_decode_gemm_kernel(encoding, kSm90a, 8192, 6144, 4096, llama);
    CHECK(long_launch.kernel == GemmKernel::wgmma_decode);
    // A W slice decoded once per pair of row tiles, with the ring chosen for the pair's shares.
    const GemmSm90Tiling paired = gemm_sm90_decode_tiling(192, eight_bit(encoding) ? 8 : 4, 2);
    CHECK(paired.cluster_m == 2);
    CHECK(long_launch.sm90 == paired);
    const GemmKernelChoice short_launch = choose_decode_gemm_kernel(encoding, kSm90a, 512, 6144, 4096, llama);
    CHECK(short_launch.sm90.block_n == 192);
    CHECK(short_launch.sm90.cluster_m == 2);
    // One row tile has nothing to pair with.
    const GemmSm90Tiling alone = choose_decode_gemm_kernel(encoding, kSm90a, 128, 6144, 4096, llama).sm90;
    CHECK(alone == gemm_sm90_decode_tiling(alone.block_n, eight_bit(encoding) ? 8 : 4));
    CHECK(alone.cluster_m == 1);
    CHECK(choose_decode_gemm_kernel(encoding, kSm90a, 129, 6144, 4096, llama).sm90.cluster_m == 2);
    // No wgmma outside sm_90a.
    CHECK(choose_decode_gemm_kernel(encoding, kSm80, 8192, 6144, 4096, llama).kernel == GemmKernel::mma_sync);
    CHECK(choose_decode_gemm_kernel(encoding, {9, 0, false}, 8192, 6144, 4096, llama).kernel ==
          GemmKernel::mma_sync);
  }
  // Act-order GPTQ (a group per k), GPTQ groups within a 32-k unit, 8-bit words, other affine widths, fp8
  // activations and bf16 are none of those.
  config::WeightEncoding fp8_activations = testing::fp8_weight_only(config::Fp8ScaleGranularity::block);
  fp8_activations.activation = config::ActivationType::fp8;
  const config::WeightEncoding others[] = {
      format(config::WeightFormat::bf16),
      fp8_activations,
      testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 128, true),
      testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 16, false),
      testing::packed_encoding(config::PackedIntegerScheme::gptq, 8, 128, false),
      testing::packed_encoding(config::PackedIntegerScheme::awq, 8, 128, false),
      testing::packed_encoding(config::PackedIntegerScheme::awq, 4, 32, false),  // groups within a slice
      testing::affine_encoding(3, 64),
      testing::affine_encoding(8, 64),
  };
  for (const config::WeightEncoding& encoding : others) {
    CHECK_FALSE(sm90_decode_gemm_supports(encoding));
    CHECK(choose_decode_gemm_kernel(encoding, kSm90a, 8192, 6144, 4096, llama).kernel ==
          GemmKernel::mma_sync);
  }
  // N 5120 at 512 tokens: 128 tiles of 160 in one round. N 4096: 128 tiles of 128.
  const int gpt_oss[] = {4096, 512, 512};
  CHECK(choose_decode_gemm_kernel(format(config::WeightFormat::mxfp4), kSm90a, 512, 5120, 2880, gpt_oss)
            .sm90.block_n == 160);
  const int o_proj[] = {4096};
  CHECK(choose_decode_gemm_kernel(format(config::WeightFormat::mxfp4), kSm90a, 512, 4096, 4096, o_proj)
            .sm90.block_n == 128);
  // Two row tiles: 64 tiles of 128 would leave half the SMs idle, 128 of 64 fill one round (unclustered:
  // 64-wide tiles never pair). N 6144 keeps 128 x2: 192 tiles of 64 would take two rounds.
  const auto mxfp4_choice = [&](int m, int n, std::span<const int> widths) {
    return choose_decode_gemm_kernel(format(config::WeightFormat::mxfp4), kSm90a, m, n, 4096, widths).sm90;
  };
  CHECK(mxfp4_choice(256, 4096, o_proj) == gemm_sm90_decode_tiling(64, 4));
  CHECK(mxfp4_choice(64, 4096, o_proj) == gemm_sm90_decode_tiling(64, 4));
  CHECK(mxfp4_choice(256, 6144, llama) == gemm_sm90_decode_tiling(128, 4, 2));
  CHECK(mxfp4_choice(128, 6144, llama) == gemm_sm90_decode_tiling(64, 4));
  CHECK(mxfp4_choice(384, 4096, o_proj) == gemm_sm90_decode_tiling(128, 4, 2));
  // K must make 16-byte rows of codes; segments as the tiles allow.
  const config::WeightEncoding nvfp4 = format(config::WeightFormat::nvfp4);
  const int one[] = {256};
  CHECK(choose_decode_gemm_kernel(nvfp4, kSm90a, 512, 256, 4112, one).kernel == GemmKernel::mma_sync);
  const int odd[] = {120, 40, 40};
  CHECK(choose_decode_gemm_kernel(nvfp4, kSm90a, 512, 200, 4096, odd).kernel == GemmKernel::mma_sync);
  CHECK(gemm_kernel_name(GemmKernel::wgmma_decode) == "wgmma_decode");
}

TEST_CASE("wgmma_decode with AWQ's words: shares of whole 32-row pieces, segments of 32-row multiples",
          "[plan][gemm][gemm_decode]") {
  CHECK(sm90_decode_awq_share_fits(128, 2));
  CHECK(sm90_decode_awq_share_fits(192, 2));  // 96 rows
  CHECK(sm90_decode_awq_share_fits(160, 1));
  CHECK(sm90_decode_awq_share_fits(64, 2));
  CHECK_FALSE(sm90_decode_awq_share_fits(160, 2));  // 80 rows
  CHECK_FALSE(sm90_decode_awq_share_fits(96, 2));   // 48
  CHECK_FALSE(sm90_decode_awq_share_fits(192, 4));  // 48
  // The chooser never offers 160 (its pairs' 80-row shares); N 5120 at 512 tokens takes what the cost
  // model ranks next.
  const int gpt_oss[] = {4096, 512, 512};
  const GemmKernelChoice choice = choose_decode_gemm_kernel(awq(128), kSm90a, 512, 5120, 2880, gpt_oss);
  CHECK(choice.kernel == GemmKernel::wgmma_decode);
  CHECK(choice.sm90.block_n != 160);
  CHECK(sm90_decode_awq_share_fits(choice.sm90.block_n, choice.sm90.cluster_m));
  const int llama[] = {4096, 1024, 1024};
  for (const int m : {1, 64, 128, 256, 511, 2048, 8192}) {
    INFO("M " << m);
    const GemmSm90Tiling tiling = choose_decode_gemm_kernel(awq(128), kSm90a, m, 6144, 4096, llama).sm90;
    CHECK(sm90_decode_awq_share_fits(tiling.block_n, tiling.cluster_m));
    // The same as the row-byte formats wherever those take a width AWQ has.
    const GemmSm90Tiling nvfp4 =
        choose_decode_gemm_kernel(format(config::WeightFormat::nvfp4), kSm90a, m, 6144, 4096, llama).sm90;
    if (nvfp4.block_n != 160) CHECK(tiling == nvfp4);
  }
  // A segment that is no multiple of 32 rows: rows of N / 8 words would not be 16-byte strides.
  const int ragged[] = {4096, 1024, 1016};
  CHECK(choose_decode_gemm_kernel(awq(128), kSm90a, 512, 6136, 4096, ragged).kernel == GemmKernel::mma_sync);
  // The stub names the policy; a share of 80 rows is refused with the rule.
  GemmSpec spec{.segments = 3, .has_bias = false};
  spec.kernel = GemmKernel::wgmma_decode;
  spec.weights = awq(128);
  spec.sm90 = gemm_sm90_decode_tiling(128, 4, 2);
  CHECK(spec.source().render_stub().find("attnplan::kernels::AwqWeights<128>") != std::string::npos);
  GemmParams params = llama_qkv_params(512);
  for (int s = 0; s < 3; ++s) params.segments[s].zeros = fake_pointer<const void>(0x2000000 * (s + 1));
  CHECK_NOTHROW(spec.check(params));
  spec.sm90 = gemm_sm90_decode_tiling(160, 4, 2);
  const std::string refused = expect_error([&] { (void)spec.source(); }).what();
  INFO(refused);
  CHECK(contains(refused, "share, 80 rows, must be a multiple of 32"));
}

TEST_CASE("wgmma_decode ring: 4 slots (decoder teams), 4 code slots where they fit",
          "[plan][gemm][gemm_decode]") {
  // 4-bit codes: 4 ring slots and 4 code slots at every width (a fifth or sixth ring slot fits at 128, but
  // four teams divide only 4).
  CHECK(gemm_sm90_decode_tiling(192, 4) == GemmSm90Tiling{.block_n = 192, .stages = 4, .code_stages = 4});
  CHECK(gemm_sm90_decode_tiling(160, 4) == GemmSm90Tiling{.block_n = 160, .stages = 4, .code_stages = 4});
  CHECK(gemm_sm90_decode_tiling(128, 4) == GemmSm90Tiling{.block_n = 128, .stages = 4, .code_stages = 4});
  // 8-bit codes at 192: 12 KiB a code slot; 4 ring slots fit beside 2 of them, not 4. In clusters of 2 a
  // code slot holds the CTA's 96 rows: 4 of them fit, and four decoder teams divide both rings.
  CHECK(gemm_sm90_decode_tiling(192, 8) == GemmSm90Tiling{.block_n = 192, .stages = 4, .code_stages = 2});
  CHECK(gemm_sm90_decode_tiling(192, 8, 2) ==
        GemmSm90Tiling{.block_n = 192, .stages = 4, .cluster_m = 2, .code_stages = 4});
  for (const int block_n : {64, 96, 128, 160, 192}) {
    for (const int bits : {4, 8}) {
      for (const int cluster_m : {1, 2, 4}) {
        if (block_n % (16 * cluster_m) != 0) continue;
        INFO(block_n << " x" << cluster_m << ", " << bits << " bits");
        const GemmSm90Tiling tiling = gemm_sm90_decode_tiling(block_n, bits, cluster_m);
        CHECK(tiling.cluster_m == cluster_m);
        CHECK(tiling.stages == 4);
        CHECK(tiling.code_stages % 2 == 0);
        CHECK(gemm_sm90_decode_dynamic_shared_bytes(block_n, cluster_m, tiling.stages, tiling.code_stages,
                                                    bits) <= 227 * 1024);
        // 2 code slots only where 4 do not fit.
        if (tiling.code_stages == 2)
          CHECK(gemm_sm90_decode_dynamic_shared_bytes(block_n, cluster_m, 4, 4, bits) > 227 * 1024);
      }
    }
  }
}

TEST_CASE("wgmma_decode spec: stub, shared memory, persistent launch shape, checks",
          "[plan][gemm][gemm_decode]") {
  GemmSpec spec{.segments = 3, .has_bias = false};
  spec.kernel = GemmKernel::wgmma_decode;
  spec.sm90 = gemm_sm90_decode_tiling(192, 4);
  spec.weights = format(config::WeightFormat::nvfp4);
  const compiler::KernelSource source = spec.source();
  const std::string stub = source.render_stub();
  INFO(stub);
  CHECK(stub.find("#include \"attnplan/gemm_sm90_decode.cuh\"") != std::string::npos);
  CHECK(stub.find("attnplan::kernels::Nvfp4Weights") != std::string::npos);
  CHECK(stub.find("__grid_constant__") != std::string::npos);
  CHECK(source.name_expression() == "attnplan::kernels::gemm_sm90_decode_kernel<Traits>");
  CHECK(source.spec.at("kernel") == "wgmma_decode");
  CHECK(source.spec.at("code_stages") == 4);
  CHECK(spec.threads() == 512);
  // 4 slots of A [128, 64] + W [192, 64] bf16, the staging boxes, 8 slot barriers, 1 KiB alignment, then 4
  // code slots of [192, 32] bytes, their barriers and reader counts, and 4 writer counts.
  CHECK(spec.dynamic_shared_bytes() ==
        4 * (128 + 192) * 64 * 2 + 4 * 64 * 64 * 2 + 64 + 1024 + 4 * (192 * 32 + 8 + 4) + 4 * 4);
  // Tiles are the bf16 kernel's [128, 192]: 4 x 32 = 128 tiles at 512 tokens.
  CHECK(spec.launch_shape(512, 6144, 132).grid.x == 128);
  CHECK(spec.launch_shape(8192, 6144, 132).grid.x == 132);
  CHECK(spec.launch_shape(8192, 6144, 132).cluster.x == 1);

  CHECK_NOTHROW(spec.check(llama_qkv_params(512)));
  // 192-wide tiles straddle segments in 32-row code pieces: q may be 4064 rows, not 4048.
  GemmParams pieces = llama_qkv_params(512);
  pieces.segments[0].n_end = pieces.segments[1].n_begin = 4064;
  CHECK_NOTHROW(spec.check(pieces));
  pieces.segments[0].n_end = pieces.segments[1].n_begin = 4048;
  CHECK(contains(expect_error([&] { spec.check(pieces); }).what(), "segments[0] is 4048 wide"));
  GemmParams k_tail = llama_qkv_params(512);
  k_tail.k = k_tail.lda = 4048;  // a multiple of nvfp4's 16, not of 32 (16-byte code rows)
  CHECK(contains(expect_error([&] { spec.check(k_tail); }).what(), "not a multiple of 32"));
  // Clusters of 2 or 4 along M, each CTA's share of the tile a multiple of 16 rows (192 / 4 = 48, not
  // 160 / 4 = 40); the launch takes whole clusters, tiles in columns of 4.
  spec.sm90.cluster_m = 4;
  const compiler::KernelSource clustered = spec.source();
  CHECK(clustered.spec.at("cluster_m") == 4);
  CHECK(clustered.render_stub().find("/*cluster_m=*/4>") != std::string::npos);
  CHECK(spec.launch_shape(512, 6144, 132).grid.x == 128);
  CHECK(spec.launch_shape(512, 6144, 132).cluster.x == 4);
  CHECK(spec.launch_shape(300, 6144, 132).grid.x == 128);  // 3 row tiles padded to a cluster of 4
  CHECK(spec.launch_shape(8192, 6144, 132).grid.x == 132);
  spec.sm90.block_n = 160;
  CHECK(contains(expect_error([&] { (void)spec.source(); }).what(),
                 "cluster_m 4 with the wgmma_decode kernel and block_n 160"));
  spec.sm90.cluster_m = 2;
  CHECK_NOTHROW(spec.source());
  spec.sm90.cluster_m = 3;
  CHECK(contains(expect_error([&] { (void)spec.source(); }).what(), "cluster_m 3 with the wgmma_decode"));
  spec.sm90 = gemm_sm90_decode_tiling(192, 4);
  // A format the kernel does not read (act-order GPTQ: a group per k) is refused when rendered, by name.
  spec.sm90.block_n = 256;
  CHECK(contains(expect_error([&] { (void)spec.source(); }).what(),
                 "block_n 256 with the wgmma_decode kernel"));
  spec.sm90.block_n = 192;
  spec.weights = testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 128, true);
  const std::string refused = expect_error([&] { (void)spec.source(); }).what();
  INFO(refused);
  CHECK(contains(refused, "wgmma_decode"));
  CHECK(contains(refused, "packed_integer"));
}

TEST_CASE("wgmma_decode specializations compile for sm_90a: no spills, wgmma from shared memory",
          "[plan][gemm][gemm_decode][nvrtc]") {
  for (const config::WeightEncoding& encoding : decode_encodings()) {
    const int bits = eight_bit(encoding) ? 8 : 4;
    // Every width, unclustered, and the clusters whose shares decode in half passes or 16-row code pieces
    // (96 x2: 48 rows).
    for (const auto& [block_n, cluster_m] : {std::pair{192, 1},
                                             {160, 1},
                                             {128, 1},
                                             {96, 1},
                                             {64, 1},
                                             {192, 2},
                                             {192, 4},
                                             {160, 2},
                                             {128, 2},
                                             {96, 2},
                                             {64, 2}}) {
      if (is_awq(encoding) && !sm90_decode_awq_share_fits(block_n, cluster_m)) continue;
      GemmSpec spec{.segments = 3, .has_bias = true};
      spec.kernel = GemmKernel::wgmma_decode;
      spec.sm90 = gemm_sm90_decode_tiling(block_n, bits, cluster_m);
      spec.weights = encoding;
      const compiler::KernelSource source = spec.source();
      INFO(source.render_stub());
      const compiler::CompiledKernel kernel = plan_testing::compile_sm90a_gemm(source, 152);
      INFO(kernel.log);
      const compiler::ResourceUsage& usage = kernel.resources;
      std::printf(
          "gemm_sm90_decode %-44s block_n %d x%d stages %d + %d: %3d registers, %d spill bytes, %d stack "
          "bytes, %d dynamic smem\n",
          source.spec.at("weights").at("policy").get<std::string>().c_str(), block_n, cluster_m,
          spec.sm90.stages, spec.sm90.code_stages, usage.registers, usage.spill_bytes(), usage.stack_bytes,
          spec.dynamic_shared_bytes());
      CHECK(kernel.lowered_name.find("gemm_sm90_decode_kernel") != std::string::npos);
      CHECK(kernel.ptx.find("wgmma.mma_async.sync.aligned.m64n" + std::to_string(block_n) +
                            "k16.f32.bf16.bf16") != std::string::npos);
    }
  }
}
