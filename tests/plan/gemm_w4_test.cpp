// The sm_90a mixed-input GEMM for 4-bit weights (gemm_sm90_w4.cuh, GemmKernel::wgmma_w4): which formats
// and shapes choose_w4_gemm_kernel gives it, its stub, launch shape and checks, and NVRTC compiles of every
// specialization for sm_90a (register A operand in the PTX, no spills).
#include <cstdio>
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

// Every encoding the kernel reads: one specialization each.
std::vector<config::WeightEncoding> w4_encodings() {
  return {format(config::WeightFormat::mxfp4),
          format(config::WeightFormat::nvfp4),
          testing::affine_encoding(4, 32),
          testing::affine_encoding(4, 64),
          testing::affine_encoding(4, 128),
          testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 128, false),
          testing::packed_encoding(config::PackedIntegerScheme::gptq_v2, 4, -1, false),
          testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 32, false)};
}

}  // namespace

TEST_CASE("wgmma_w4: sm_90a, the row-major 4-bit formats, segments of whole 128-row tiles",
          "[plan][gemm][gemm_w4]") {
  const int llama[] = {4096, 1024, 1024};
  if (!sm90_w4_gemm_enabled()) {  // switched off (gemm_spec.cpp): every 4-bit product stays on mma.sync
    for (const config::WeightEncoding& encoding : w4_encodings())
      CHECK(choose_w4_gemm_kernel(encoding, kSm90a, 8192, 6144, 4096, llama).kernel == GemmKernel::mma_sync);
    return;
  }
  for (const config::WeightEncoding& encoding : w4_encodings()) {
    INFO(config::to_string(encoding.format) << " group " << encoding.group_size);
    CHECK(sm90_w4_gemm_supports(encoding));
    const GemmKernelChoice choice = choose_w4_gemm_kernel(encoding, kSm90a, 8192, 6144, 4096, llama);
    CHECK(choice.kernel == GemmKernel::wgmma_w4);
    CHECK(choice.sm90 == GemmSm90Tiling{.block_n = 256, .stages = 5});
    // No wgmma outside sm_90a.
    CHECK(choose_w4_gemm_kernel(encoding, kSm80, 8192, 6144, 4096, llama).kernel == GemmKernel::mma_sync);
    CHECK(choose_w4_gemm_kernel(encoding, {9, 0, false}, 8192, 6144, 4096, llama).kernel ==
          GemmKernel::mma_sync);
  }
  // 8-bit codes ([N, K] bytes) and AWQ's words ([K, N / 8]): 8-bit codes with five 256-token slots (40 KiB
  // each) instead of six.
  std::vector<config::WeightEncoding> wide_codes = testing::sm90_w8_encodings();
  wide_codes.push_back(testing::packed_encoding(config::PackedIntegerScheme::awq, 4, 128, false));
  for (const config::WeightEncoding& encoding : wide_codes) {
    INFO(config::to_string(encoding.format) << " " << config::to_string(encoding.scale_granularity));
    CHECK(sm90_w4_gemm_supports(encoding));
    const GemmKernelChoice choice = choose_w4_gemm_kernel(encoding, kSm90a, 8192, 6144, 4096, llama);
    CHECK(choice.kernel == GemmKernel::wgmma_w4);
    const bool eight = encoding.format != config::WeightFormat::packed_integer;
    CHECK(choice.sm90 == GemmSm90Tiling{.block_n = 256, .stages = eight ? 4 : 5});
  }
  config::WeightEncoding fp8_activations = testing::fp8_weight_only(config::Fp8ScaleGranularity::block);
  fp8_activations.activation = config::ActivationType::fp8;  // gemm_sm90_fp8.cuh's
  CHECK_FALSE(sm90_w4_gemm_supports(fp8_activations));
  // Formats whose codes are neither [N, K / 2] nor [N, K] row-major bytes stay on mma.sync.
  const config::WeightEncoding others[] = {
      format(config::WeightFormat::bf16),
      testing::packed_encoding(config::PackedIntegerScheme::awq, 4, 128, true),   // act order
      testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 128, true),  // act order
      testing::packed_encoding(config::PackedIntegerScheme::gptq, 8, 128, false),
      testing::packed_encoding(config::PackedIntegerScheme::gptq, 4, 8, false),  // groups inside a k16 step
      testing::affine_encoding(3, 64),
      testing::affine_encoding(8, 64),
  };
  for (const config::WeightEncoding& encoding : others) {
    CHECK_FALSE(sm90_w4_gemm_supports(encoding));
    CHECK(choose_w4_gemm_kernel(encoding, kSm90a, 8192, 6144, 4096, llama).kernel == GemmKernel::mma_sync);
  }
  const config::WeightEncoding mxfp4 = format(config::WeightFormat::mxfp4);
  // A segment other than the last that is no whole number of 128-row tiles; K not a multiple of 32.
  const int odd[] = {120, 40, 40};
  CHECK(choose_w4_gemm_kernel(mxfp4, kSm90a, 512, 200, 4096, odd).kernel == GemmKernel::mma_sync);
  const int ragged_last[] = {1536, 64};
  CHECK(choose_w4_gemm_kernel(mxfp4, kSm90a, 1000, 1600, 4096, ragged_last).kernel == GemmKernel::wgmma_w4);
  const int nvfp4_k[] = {256};
  CHECK(choose_w4_gemm_kernel(format(config::WeightFormat::nvfp4), kSm90a, 512, 256, 4112, nvfp4_k).kernel ==
        GemmKernel::mma_sync);
  // Token tile: 256 unless 128-token tiles need fewer rounds over the 132 SMs by more than 10%.
  // 512 tokens x 48 row tiles: 96 tiles of 256 (one round) against 192 of 128 (two rounds).
  CHECK(choose_w4_gemm_kernel(mxfp4, kSm90a, 512, 6144, 4096, llama).sm90.block_n == 256);
  // 300 tokens x 8 row tiles: 16 tiles of 256 (one round of 256 tokens) against 24 of 128 (one of 128).
  const int o_proj[] = {1024};
  CHECK(choose_w4_gemm_kernel(mxfp4, kSm90a, 300, 1024, 4096, o_proj).sm90 ==
        GemmSm90Tiling{.block_n = 128, .stages = 8});
  CHECK(gemm_kernel_name(GemmKernel::wgmma_w4) == "wgmma_w4");
}

TEST_CASE("wgmma_w4 spec: stub, shared memory, persistent launch shape, checks", "[plan][gemm][gemm_w4]") {
  GemmSpec spec{.segments = 3, .has_bias = false};
  spec.kernel = GemmKernel::wgmma_w4;
  spec.sm90 = {.block_n = 256, .stages = 5};
  spec.weights = format(config::WeightFormat::mxfp4);
  const compiler::KernelSource source = spec.source();
  const std::string stub = source.render_stub();
  INFO(stub);
  CHECK(stub.find("#include \"attnplan/gemm_sm90_w4.cuh\"") != std::string::npos);
  CHECK(stub.find("attnplan::kernels::Mxfp4Weights") != std::string::npos);
  CHECK(stub.find("__grid_constant__") != std::string::npos);
  CHECK(source.name_expression() == "attnplan::kernels::gemm_sm90_w4_kernel<Traits>");
  CHECK(source.spec.at("kernel") == "wgmma_w4");
  CHECK(spec.threads() == 384);
  // 5 slots of X [256, 64] bf16 + codes [128, 32] bytes, the four [64, 64] bf16 staging boxes, 10 barriers,
  // 1 KiB alignment.
  CHECK(spec.dynamic_shared_bytes() == 5 * (32768 + 4096) + 4 * 64 * 64 * 2 + 80 + 1024);
  CHECK(spec.dynamic_shared_bytes() <= 227 * 1024);
  // Tiles are [256 tokens, 128 weight rows]: 32 x 48 = 1536 tiles over 132 persistent CTAs.
  CHECK(spec.launch_shape(8192, 6144, 132).grid.x == 132);
  CHECK(spec.launch_shape(512, 6144, 132).grid.x == 96);
  CHECK(spec.launch_shape(1, 100, 132).grid.x == 1);
  CHECK(spec.launch_shape(1, 100, 132).block.x == 384);

  CHECK_NOTHROW(spec.check(llama_qkv_params(8192)));
  GemmParams misaligned_segment = llama_qkv_params(8192);  // q is 4032 rows: a tile would straddle q | k
  misaligned_segment.segments[0].n_end = misaligned_segment.segments[1].n_begin = 4032;
  CHECK(contains(expect_error([&] { spec.check(misaligned_segment); }).what(), "segments[0] is 4032 wide"));
  GemmParams k_tail = llama_qkv_params(8192);
  k_tail.k = k_tail.lda = 4064;  // 127 x 32: allowed (a half K slot at the end)
  CHECK_NOTHROW(spec.check(k_tail));
  spec.weights = format(config::WeightFormat::nvfp4);
  for (int s = 0; s < 3; ++s) k_tail.segments[s].scale_2 = fake_pointer<const float>(0x4000000);
  k_tail.k = k_tail.lda = 4048;  // a multiple of nvfp4's 16, not of the kernel's 32
  CHECK(contains(expect_error([&] { spec.check(k_tail); }).what(), "not a multiple of 32"));
  // AWQ: every segment's N / 8 words must make a 16-byte TMA stride (N a multiple of 32).
  spec.weights = testing::packed_encoding(config::PackedIntegerScheme::awq, 4, 128, false);
  GemmParams awq = llama_qkv_params(512);
  for (int s = 0; s < 3; ++s) awq.segments[s].zeros = fake_pointer<const void>(0x5000000 * (s + 1));
  CHECK_NOTHROW(spec.check(awq));
  GemmParams narrow = awq;
  narrow.segments[2].n_end = narrow.n = 6144 - 8;  // v is 1016 rows
  CHECK(contains(expect_error([&] { spec.check(narrow); }).what(), "segments[2] is 1016 wide"));
  // A format the kernel has no loader for is refused when rendered, by name.
  spec.weights = testing::packed_encoding(config::PackedIntegerScheme::gptq, 8, 128, false);
  const std::string refused = expect_error([&] { (void)spec.source(); }).what();
  INFO(refused);
  CHECK(contains(refused, "wgmma_w4"));
  CHECK(contains(refused, "packed_integer"));
  CHECK(contains(refused, "8 bits"));
}

TEST_CASE("wgmma_w4 specializations compile for sm_90a: register-A wgmma, no spills",
          "[plan][gemm][gemm_w4][nvrtc]") {
  std::vector<config::WeightEncoding> encodings = w4_encodings();
  encodings.push_back(testing::packed_encoding(config::PackedIntegerScheme::awq, 4, 128, false));
  encodings.push_back(testing::packed_encoding(config::PackedIntegerScheme::awq, 4, -1, false));
  for (const config::WeightEncoding& encoding : testing::sm90_w8_encodings()) encodings.push_back(encoding);
  for (const config::WeightEncoding& encoding : encodings) {
    const bool eight =
        encoding.format == config::WeightFormat::fp8 || encoding.format == config::WeightFormat::mxfp8;
    const GemmSm90Tiling tilings[] = {{.block_n = 256, .stages = eight ? 4 : 5},
                                      {.block_n = 128, .stages = 8}};
    for (const GemmSm90Tiling& tiling : tilings) {
      GemmSpec spec{.segments = 3, .has_bias = true};
      spec.kernel = GemmKernel::wgmma_w4;
      spec.sm90 = tiling;
      spec.weights = encoding;
      const compiler::KernelSource source = spec.source();
      INFO(source.render_stub());
      const compiler::CompiledKernel kernel = plan_testing::compile_sm90a_gemm(source);
      INFO(kernel.log);
      const compiler::ResourceUsage& usage = kernel.resources;
      std::printf(
          "gemm_sm90_w4 %-48s tokens %d stages %d: %3d registers, %d spill bytes, %d stack bytes, %d "
          "dynamic smem\n",
          source.spec.at("weights").at("policy").get<std::string>().c_str(), tiling.block_n, tiling.stages,
          usage.registers, usage.spill_bytes(), usage.stack_bytes, spec.dynamic_shared_bytes());
      CHECK(kernel.lowered_name.find("gemm_sm90_w4_kernel") != std::string::npos);
      // The A operand from registers: "{%r.., %r.., %r.., %r..}" right after the accumulator list.
      const std::string wgmma =
          "wgmma.mma_async.sync.aligned.m64n" + std::to_string(tiling.block_n) + "k16.f32.bf16.bf16";
      CHECK(kernel.ptx.find(wgmma) != std::string::npos);  // serialization: compile_sm90a_gemm checks it
    }
  }
  // The header compiles for sm_80 too (the body is compiled out), but the plan never picks it there.
  GemmSpec spec{.segments = 1};
  spec.kernel = GemmKernel::wgmma_w4;
  spec.weights = format(config::WeightFormat::mxfp4);
  const compiler::CompiledKernel sm80 =
      plan_testing::source_tree_compiler().compile(spec.source(), compiler::CompileOptions{kSm80});
  CHECK(sm80.ptx.find("wgmma") == std::string::npos);
}
