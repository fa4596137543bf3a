// The projection GEMM's tile heuristic, spec rendering and Params checks (pure), and real NVRTC compiles
// of its specializations for sm_80 and sm_90a with their ptxas resource reports (no GPU needed).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "compiler/compiler.hpp"
#include "core/error.hpp"
#include "plan/gemm_spec.hpp"
#include "plan_testing.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::plan_testing;
using namespace attnplan::plan;

namespace {

const GemmTiling kLarge{
    .block_m = 128, .block_n = 128, .block_k = 32, .warps_m = 2, .warps_n = 4, .stages = 4};
const GemmTiling kMedium{
    .block_m = 64, .block_n = 128, .block_k = 64, .warps_m = 2, .warps_n = 2, .stages = 3};
const GemmTiling kSmall{.block_m = 64, .block_n = 64, .block_k = 64, .warps_m = 2, .warps_n = 2, .stages = 4};

// A valid Params for Llama's QKV projection split into q | k | v segments.
GemmParams llama_qkv_params() {
  GemmParams params{};
  params.a = fake_pointer<const bf16_bits>(0x10000);
  params.c = fake_pointer<bf16_bits>(0x20000);
  params.m = 300;
  params.n = 6144;
  params.k = 4096;
  params.lda = 4096;
  params.ldc = 6144;
  params.segments[0] = {fake_pointer<const bf16_bits>(0x100000), nullptr, 0, 4096};
  params.segments[1] = {fake_pointer<const bf16_bits>(0x200000), nullptr, 4096, 5120};
  params.segments[2] = {fake_pointer<const bf16_bits>(0x300000), nullptr, 5120, 6144};
  return params;
}

}  // namespace

TEST_CASE("gemm tiling: large M takes 128x128, small M smaller tiles that fill the SMs", "[plan][gemm]") {
  // Prefill of thousands of tokens: many rounds of two 128x128 CTAs per SM, the best rate.
  CHECK(choose_gemm_tiling(8192, 6144, 4096, kSm90a) == kLarge);
  CHECK(choose_gemm_tiling(8192, 4096, 4096, kSm80) == kLarge);
  CHECK(choose_gemm_tiling(4096, 2880, 2880, kSm90a) == kLarge);
  // 300 tokens (measured on an H200): 3 x 48 = 144 large tiles put two 128x128 CTAs on some SMs
  // (0.098 ms), 5 x 48 tiles of 64x128 at most two shorter CTAs per SM (0.056 ms).
  CHECK(choose_gemm_tiling(300, 6144, 4096, kSm90a) == kMedium);
  // o_proj at 300 tokens: 96 large tiles leave SMs idle and each CTA latency-bound (0.073 ms); 160 tiles
  // of 64x128 (0.056 ms); 320 of 64x64, three on some SMs (0.062 ms).
  CHECK(choose_gemm_tiling(300, 4096, 4096, kSm90a) == kMedium);
  // One token, or a handful: weight-streaming, bound by one CTA's trip over K, and 64x64 has twice the
  // CTAs of 64x128 (0.039 ms against 0.043 and 0.068 for N = 6144).
  CHECK(choose_gemm_tiling(1, 6144, 4096, kSm90a) == kSmall);
  CHECK(choose_gemm_tiling(37, 4096, 4096, kSm90a) == kSmall);
  // A tiny product: any 4-warp tile (their estimates are within a few percent).
  CHECK(choose_gemm_tiling(1, 200, 72, kSm80).block_m == 64);
}

TEST_CASE("gemm tiling: every choice is a valid warp grid for any shape", "[plan][gemm]") {
  for (const config::Arch arch : {kSm80, kSm89, kSm90a}) {
    for (int m : {0, 1, 7, 37, 64, 65, 300, 1000, 4096, 8192, 65536}) {
      for (int n : {8, 200, 1024, 2880, 4096, 6144, 18432}) {
        for (int k : {8, 72, 2880, 4096}) {
          const GemmTiling t = choose_gemm_tiling(m, n, k, arch);
          INFO(arch.name() << " m " << m << " n " << n << " k " << k);
          CHECK(t.block_m % (16 * t.warps_m) == 0);
          CHECK(t.block_n % (16 * t.warps_n) == 0);
          CHECK(t.block_k % 16 == 0);
          CHECK(t.stages >= 2);
          CHECK((t.threads() == 128 || t.threads() == 256));
          // Fits the smallest opt-in shared memory of the supported archs (sm_89: 99 KiB).
          CHECK(GemmSpec{1, false, t}.dynamic_shared_bytes() <= 99 * 1024);
        }
      }
    }
  }
  // Larger M never picks a smaller tile area.
  int previous_area = 0;
  for (int m = 1; m <= 16384; m *= 2) {
    const GemmTiling t = choose_gemm_tiling(m, 4096, 4096, kSm90a);
    CHECK(t.block_m * t.block_n >= previous_area);
    previous_area = t.block_m * t.block_n;
  }
}

TEST_CASE("gemm spec renders a stub with named arguments and a launch shape", "[plan][gemm]") {
  const GemmSpec spec{.segments = 3, .has_bias = true, .tiling = kLarge};
  const compiler::KernelSource source = spec.source();
  const std::string stub = source.render_stub();
  INFO(stub);
  CHECK(stub.find("#include \"attnplan/gemm.cuh\"") != std::string::npos);
  CHECK(stub.find("attnplan::kernels::GemmTraits</*block_m=*/128, /*block_n=*/128, /*block_k=*/32, "
                  "/*warps_m=*/2, /*warps_n=*/4, /*stages=*/4, /*segments=*/3, /*has_bias=*/true>") !=
        std::string::npos);
  CHECK(source.name_expression() == "attnplan::kernels::gemm_kernel<Traits>");
  CHECK(source.spec.at("dynamic_shared_bytes") == 65536);

  CHECK(spec.dynamic_shared_bytes() == 4 * (128 + 128) * 32 * 2);
  CHECK(GemmSpec{1, false, kMedium}.dynamic_shared_bytes() == 3 * (64 + 128) * 64 * 2);
  // A one-stage-deep pipeline would be smaller than the epilogue's staging tile, which then decides.
  GemmTiling shallow = kMedium;
  shallow.stages = 2;
  shallow.block_k = 16;  // 2 * 192 rows * 32 bytes < 64 rows * 272 bytes
  CHECK(GemmSpec{1, false, shallow}.dynamic_shared_bytes() == 64 * (128 + 8) * 2);

  const driver::LaunchShape shape = spec.launch_shape(300, 6144);
  CHECK(shape.grid.x == 3 * 48);
  CHECK(shape.grid.y == 1);
  CHECK(shape.block.x == 256);
  CHECK(shape.dynamic_shared_bytes == 65536u);
  CHECK(GemmSpec{1, false, kSmall}.launch_shape(1, 200).grid.x == 4);
  CHECK_THROWS_AS(spec.launch_shape(0, 6144), Error);
}

TEST_CASE("gemm spec checks Params against the kernel's preconditions", "[plan][gemm]") {
  const GemmSpec spec{.segments = 3, .has_bias = false, .tiling = kLarge};
  CHECK_NOTHROW(spec.check(llama_qkv_params()));

  auto rejects = [&](auto edit, const GemmSpec& with = GemmSpec{3, false, GemmTiling{}}) {
    GemmParams params = llama_qkv_params();
    edit(params);
    CHECK_THROWS_AS(with.check(params), Error);
  };
  rejects([](GemmParams& p) { p.k = 4092; });                                    // K not a multiple of 8
  rejects([](GemmParams& p) { p.lda = 4092; });                                  // lda < K
  rejects([](GemmParams& p) { p.lda = 4100; });                                  // lda not a multiple of 8
  rejects([](GemmParams& p) { p.ldc = 6100; });                                  // ldc < N
  rejects([](GemmParams& p) { p.a = fake_pointer<const bf16_bits>(0x10008); });  // 8-byte aligned only
  rejects([](GemmParams& p) { p.c = nullptr; });
  rejects([](GemmParams& p) { p.segments[1].weight = fake_pointer<const bf16_bits>(0x200002); });
  rejects([](GemmParams& p) { p.segments[1].n_begin = 4000; });  // a gap / overlap between segments
  rejects([](GemmParams& p) { p.segments[2].n_end = 6000; });    // segments do not reach N
  rejects(
      [](GemmParams& p) { p.segments[0].bias = fake_pointer<const bf16_bits>(0x400000); });  // no-bias spec
  rejects([](GemmParams& p) { p.segments[0].bias = fake_pointer<const bf16_bits>(0x400001); },
          GemmSpec{3, true, GemmTiling{}});  // misaligned bias
  rejects([](GemmParams& p) { p.m = -1; });

  // One fused segment covering all of N; the other entries are ignored.
  GemmParams fused = llama_qkv_params();
  fused.segments[0].n_end = 6144;
  fused.segments[0].bias = fake_pointer<const bf16_bits>(0x400000);
  const GemmSpec one_segment{1, true, kLarge};
  const GemmSpec three_segments{3, true, kLarge};
  CHECK_NOTHROW(one_segment.check(fused));
  CHECK_THROWS_AS(three_segments.check(fused), Error);

  // Nothing to do: nothing to check.
  GemmParams empty{};
  CHECK_NOTHROW(spec.check(empty));
}

TEST_CASE("gemm specializations compile for sm_80 and sm_90a without spills", "[plan][gemm][nvrtc]") {
  struct Variant {
    GemmTiling tiling;
    int segments;
    bool has_bias;
  };
  const std::vector<Variant> variants = {
      {kLarge, 3, false}, {kLarge, 1, true}, {kMedium, 3, true}, {kMedium, 1, false}, {kSmall, 3, true},
  };
  for (const config::Arch arch : {kSm80, kSm90a}) {
    for (const Variant& variant : variants) {
      const GemmSpec spec{variant.segments, variant.has_bias, variant.tiling};
      const compiler::KernelSource source = spec.source();
      INFO(arch.name() << "\n" << source.render_stub());
      const compiler::CompiledKernel kernel =
          plan_testing::source_tree_compiler().compile(source, compiler::CompileOptions{arch});
      INFO(kernel.log);
      const compiler::ResourceUsage& usage = kernel.resources;
      std::printf(
          "gemm %s %3dx%3dx%2d warps %dx%d stages %d segments %d bias %d: %3d registers, "
          "%d spill bytes, %d stack bytes, %d static smem, %d dynamic smem\n",
          arch.name().c_str(), spec.tiling.block_m, spec.tiling.block_n, spec.tiling.block_k,
          spec.tiling.warps_m, spec.tiling.warps_n, spec.tiling.stages, spec.segments, spec.has_bias,
          usage.registers, usage.spill_bytes(), usage.stack_bytes, usage.shared_bytes,
          spec.dynamic_shared_bytes());
      CHECK(kernel.lowered_name.find("gemm_kernel") != std::string::npos);
      CHECK(usage.spill_bytes() == 0);
      CHECK(usage.stack_bytes == 0);
      CHECK(usage.shared_bytes == 0);  // all of it is dynamic
      // At least two CTAs per SM by registers (65536), and no more registers than the tile heuristic's
      // residency estimate assumes (126 for 128x128, 177 for 64x128, 91 for 64x64).
      CHECK(usage.registers * spec.threads() * 2 <= 65536);
      CHECK(usage.registers <= (spec.threads() == 256 ? 126 : spec.tiling.block_n == 128 ? 177 : 91));
    }
  }
}

TEST_CASE("gemm kernel: wgmma only for sm_90a, with segments a whole number of tiles (or W pieces) wide",
          "[plan][gemm]") {
  const int llama[] = {4096, 1024, 1024};
  const GemmKernelChoice wide{GemmKernel::wgmma, {.block_n = 256, .stages = 4}};
  const GemmKernelChoice mid{GemmKernel::wgmma, {.block_n = 192, .stages = 4}};
  const GemmKernelChoice n160{GemmKernel::wgmma, {.block_n = 160, .stages = 5}};
  const GemmKernelChoice narrow{GemmKernel::wgmma, {.block_n = 128, .stages = 6}};
  // Other archs, and plain sm_90 (no wgmma outside the architecture-specific target), keep mma.sync.
  for (const config::Arch arch : {kSm80, kSm86, kSm89, config::Arch{9, 0, false}, kSm100a}) {
    INFO(arch.name());
    CHECK(choose_gemm_kernel(arch, 8192, 6144, 4096, llama).kernel == GemmKernel::mma_sync);
  }
  CHECK(choose_gemm_kernel(kSm90a, 8192, 6144, 4096, llama) == wide);
  // The last segment may end anywhere (TMA zero-fills past it); the others decide block_n.
  const int ragged_last[] = {4096, 1024, 1000};
  CHECK(choose_gemm_kernel(kSm90a, 8192, 6120, 4096, ragged_last) == wide);
  // kv_heads 1, head_dim 128: 128-wide tiles, or 160/192-wide ones straddling; 17 rounds of 128 (2394)
  // beat 14 of 160 (2576) and 12 of 192 (2534).
  const int one_kv_head[] = {4096, 128, 128};
  CHECK(choose_gemm_kernel(kSm90a, 8192, 4352, 4096, one_kv_head) == narrow);
  const int odd[] = {120, 40, 40};  // not even whole 32-row W pieces: the mma.sync kernel reads per row
  CHECK(choose_gemm_kernel(kSm90a, 37, 200, 2880, odd).kernel == GemmKernel::mma_sync);
  // Whole W pieces, no whole tiles: only 160 and 192 (straddling) fit; both make 3 x 64 tiles in two
  // rounds, and the narrower costs less (368 against 422).
  const int pieces[] = {160, 96, 200};
  CHECK(choose_gemm_kernel(kSm90a, 8192, 456, 264, pieces) == n160);
  // N = 5120 (gpt-oss-20b q|k|v with its 4096-wide q, Qwen3-32B o) at 512 tokens: 4 x 32 = 128 tiles of
  // 160 in one round (184 column-units: 1.15 per column) beat 108 of 192 (211), 80 of 256 (256) and 160 of
  // 128 in two (282).
  const int gpt_oss[] = {4096, 512, 512};
  const int qwen_o[] = {5120};
  CHECK(choose_gemm_kernel(kSm90a, kSmallLaunchTokens, 5120, 2880, gpt_oss) == n160);
  CHECK(choose_gemm_kernel(kSm90a, kSmallLaunchTokens, 5120, 8192, qwen_o) == n160);
  // N = 6144 at 512: 160 makes 4 x 39 tiles, two rounds (368); 192 one round of 128 (211).
  CHECK(choose_gemm_kernel(kSm90a, kSmallLaunchTokens, 6144, 4096, llama) == mid);
  // At 2048 (16 row tiles): 5 rounds of 128 (704) beat 4 of 160 (736), 4 of 192 (845) and 3 of 256 (768).
  CHECK(choose_gemm_kernel(kSm90a, 2048, 5120, 2880, gpt_oss) == narrow);
  const int fused[] = {6144};
  CHECK(choose_gemm_kernel(kSm90a, 8192, 6144, 4096, fused) == wide);
  // o_proj at 1100 tokens: 9 x 16 wide tiles need two rounds over 132 SMs (512 column-units), 9 x 22 of
  // 192 two (422), 9 x 26 of 160 two (368), 9 x 32 of 128 three (422): 160. At 1000 tokens 128 wide tiles
  // fit in one round (the 512-token narrow pick is below).
  const int o_proj[] = {4096};
  CHECK(choose_gemm_kernel(kSm90a, 1100, 4096, 4096, o_proj) == n160);
  CHECK(choose_gemm_kernel(kSm90a, 1000, 4096, 4096, o_proj) == wide);
  // 300 tokens of q|k|v: 3 x 39 tiles of 160 in one round (184) beat 3 x 32 of 192 (211) and 3 x 24 of
  // 256 (256).
  CHECK(choose_gemm_kernel(kSm90a, 300, 6144, 4096, llama) == n160);
  CHECK(choose_gemm_kernel(kSm90a, 2048, 6144, 4096, llama) == wide);
  // Nothing to multiply: no preference.
  CHECK(choose_gemm_kernel(kSm90a, 8192, 0, 4096, fused).kernel == GemmKernel::mma_sync);
  CHECK(choose_gemm_kernel(kSm90a, 8192, 6144, 0, fused).kernel == GemmKernel::mma_sync);
  CHECK(gemm_kernel_name(GemmKernel::wgmma) == "wgmma");
  CHECK(gemm_kernel_name(GemmKernel::mma_sync) == "mma_sync");
}

TEST_CASE("gemm variant: a launch's real M and SM count pick between two compiled wgmma tilings",
          "[plan][gemm]") {
  const GemmSm90Tiling wide{.block_n = 256, .stages = 4}, narrow{.block_n = 128, .stages = 6};
  // Llama-3.1-8B o_proj (N 4096) planned for 8k tokens (wide). At 512 tokens: 4 x 16 = 64 wide tiles leave
  // half of 132 SMs idle (one round of 256); 4 x 32 narrow tiles also take one round (128 x 1.1).
  const GemmVariantChoice short_chunk = choose_gemm_variant(512, 4096, wide, narrow, 132);
  CHECK(short_chunk.small);
  CHECK(short_chunk.planned_cost == 256.0);
  CHECK(short_chunk.small_cost == Approx(140.8));
  // At 8k the planned tiling stays: 1024 wide tiles in 8 rounds beat 2048 narrow ones in 16.
  CHECK_FALSE(choose_gemm_variant(8192, 4096, wide, narrow, 132).small);
  // The qkv projection (N 6144) at 512 tokens: 96 wide tiles in one round beat 192 narrow in two, and lose
  // to 128 tiles of 192 in one.
  CHECK_FALSE(choose_gemm_variant(512, 6144, wide, narrow, 132).small);
  const GemmSm90Tiling mid{.block_n = 192, .stages = 4};
  CHECK(choose_gemm_variant(512, 6144, wide, mid, 132).small);
  CHECK(choose_gemm_variant(512, 6144, wide, mid, 132).small_cost == Approx(192 * 1.1));
  // The device's SM count decides, not the typical one: 66 SMs make the narrow tiles two rounds too.
  CHECK_FALSE(choose_gemm_variant(512, 4096, wide, narrow, 66).small);
  // 0 SMs: the typical sm_90 part (132); a tie keeps the planned tiling.
  CHECK(choose_gemm_variant(512, 4096, wide, narrow, 0).small);
  CHECK_FALSE(choose_gemm_variant(512, 4096, wide, wide, 132).small);
  // choose_gemm_kernel compares the same costs at its m_hint on the typical SM count.
  const int o_proj[] = {4096};
  CHECK(choose_gemm_kernel(kSm90a, kSmallLaunchTokens, 4096, 4096, o_proj).sm90 == narrow);
  CHECK(gemm_sm90_cost(1100, 4096, wide, 132) == 512.0);
  CHECK(gemm_sm90_cost(1100, 4096, narrow, 132) == Approx(3 * 128 * 1.1));
}

TEST_CASE("gemm spec for wgmma: stub, shared memory, persistent launch shape, segment check",
          "[plan][gemm]") {
  const GemmSpec spec{.segments = 3,
                      .has_bias = true,
                      .tiling = kLarge,
                      .kernel = GemmKernel::wgmma,
                      .sm90 = {.block_n = 256, .stages = 4}};
  const compiler::KernelSource source = spec.source();
  const std::string stub = source.render_stub();
  INFO(stub);
  CHECK(stub.find("#include \"attnplan/gemm_sm90.cuh\"") != std::string::npos);
  CHECK(stub.find("attnplan::kernels::GemmSm90Traits</*block_n=*/256, /*stages=*/4, /*segments=*/3, "
                  "/*has_bias=*/true>") != std::string::npos);
  CHECK(stub.find("(const __grid_constant__ Traits::Params)") != std::string::npos);
  CHECK(source.name_expression() == "attnplan::kernels::gemm_sm90_kernel<Traits>");
  CHECK(source.spec.at("kernel") == "wgmma");
  // 4 slots of A [128, 64] + W [256, 64] bf16, the epilogue's four [64, 64] bf16 staging boxes, 8 mbarriers,
  // 1 KiB of alignment slack.
  CHECK(spec.dynamic_shared_bytes() == 4 * (128 + 256) * 64 * 2 + 4 * 64 * 64 * 2 + 8 * 8 + 1024);
  CHECK(spec.dynamic_shared_bytes() <= 227 * 1024);
  CHECK(spec.threads() == 384);
  // The mma.sync stub does not carry the annotation (its cache keys are unchanged).
  CHECK(GemmSpec{3, true, kLarge}.source().render_stub().find("__grid_constant__") == std::string::npos);

  // Persistent: at most one CTA per SM; fewer when there are fewer tiles.
  CHECK(spec.launch_shape(8192, 6144, 132).grid.x == 132);
  CHECK(spec.launch_shape(8192, 6144, 114).grid.x == 114);
  CHECK(spec.launch_shape(8192, 6144).grid.x == 132);  // no device given: an H100/H200's 132
  CHECK(spec.launch_shape(300, 6144, 132).grid.x == 3 * 24);
  CHECK(spec.launch_shape(1, 100, 132).grid.x == 1);
  CHECK(spec.launch_shape(300, 6144, 132).block.x == 384);
  CHECK(spec.launch_shape(300, 6144, 132).dynamic_shared_bytes == unsigned(spec.dynamic_shared_bytes()));
  CHECK_THROWS_AS(spec.launch_shape(0, 6144, 132), Error);

  GemmSpec no_bias = spec;
  no_bias.has_bias = false;
  CHECK_NOTHROW(no_bias.check(llama_qkv_params()));
  // k = 128 wide: a 256-wide tile would straddle k | v; the 128-wide kernel takes it.
  GemmParams narrow_k = llama_qkv_params();
  narrow_k.segments[1].n_end = 4224;
  narrow_k.segments[2].n_begin = 4224;
  CHECK_THROWS_AS(no_bias.check(narrow_k), Error);
  GemmSpec narrow = no_bias;
  narrow.sm90 = {.block_n = 128, .stages = 6};
  CHECK_NOTHROW(narrow.check(narrow_k));
  // 192-wide tiles straddle segments in 32-row W pieces: any boundaries at multiples of 32.
  GemmSpec mid = no_bias;
  mid.sm90 = {.block_n = 192, .stages = 4};
  CHECK_NOTHROW(mid.check(llama_qkv_params()));
  CHECK_NOTHROW(mid.check(narrow_k));
  GemmParams unpieced = llama_qkv_params();
  unpieced.segments[0].n_end = unpieced.segments[1].n_begin = 4080;
  std::string message;
  try {
    mid.check(unpieced);
  } catch (const Error& error) {
    message = error.what();
  }
  CHECK(message.find("segments[0] is 4080 wide, not a multiple of the wgmma kernel's 32-row W pieces") !=
        std::string::npos);
  CHECK(mid.dynamic_shared_bytes() == 4 * (128 + 192) * 64 * 2 + 4 * 64 * 64 * 2 + 8 * 8 + 1024);
  // The same rule over plain widths (the heuristic's): whole tiles for 128 and 256, whole pieces for 160/192.
  const int llama_widths[] = {4096, 1024, 1024}, one_kv[] = {4096, 128, 128}, pieces[] = {160, 96, 200};
  CHECK(gemm_sm90_segments_fit(llama_widths, 256));
  CHECK_FALSE(gemm_sm90_segments_fit(one_kv, 256));
  CHECK(gemm_sm90_segments_fit(one_kv, 128));
  CHECK(gemm_sm90_segments_fit(pieces, 160));
  CHECK(gemm_sm90_segments_fit(pieces, 192));
  CHECK_FALSE(gemm_sm90_segments_fit(pieces, 128));
  CHECK(gemm_sm90_w_box_rows(192, 1, 3) == 32);  // the pieces' TMA box
  CHECK(gemm_sm90_w_box_rows(192, 2, 1) == 96);  // one segment: the CTA's whole share
  CHECK(gemm_sm90_w_box_rows(256, 2, 3) == 128);
  // The last segment may be ragged.
  GemmParams ragged = llama_qkv_params();
  ragged.n = ragged.segments[2].n_end = 6100;
  CHECK_NOTHROW(no_bias.check(ragged));
  GemmParams no_k = llama_qkv_params();
  no_k.k = 0;
  CHECK_THROWS_AS(no_bias.check(no_k), Error);
  CHECK_NOTHROW(GemmSpec{3, false, kLarge}.check(no_k));  // mma.sync writes the bias-only product
}

TEST_CASE("gemm spec for wgmma with clusters of 2: stub, cluster launch shape, kernels that refuse it",
          "[plan][gemm]") {
  GemmSpec spec{.segments = 3, .has_bias = true, .tiling = kLarge, .kernel = GemmKernel::wgmma};
  spec.sm90 = {.block_n = 256, .stages = 4, .cluster_m = 2};
  const compiler::KernelSource source = spec.source();
  CHECK(source.render_stub().find("GemmSm90Traits</*block_n=*/256, /*stages=*/4, /*segments=*/3, "
                                  "/*has_bias=*/true, /*cluster_m=*/2>") != std::string::npos);
  CHECK(source.spec.at("cluster_m") == 2);
  // Unclustered specializations render as before clusters existed (same cache keys).
  GemmSpec single = spec;
  single.sm90.cluster_m = 1;
  CHECK(single.source().render_stub().find("cluster_m") == std::string::npos);
  CHECK_FALSE(single.source().spec.contains("cluster_m"));
  CHECK(spec.dynamic_shared_bytes() == single.dynamic_shared_bytes());

  // Whole clusters: tiles in columns of two (an odd number of row tiles is padded), at most one CTA per SM.
  const driver::LaunchShape large = spec.launch_shape(8192, 6144, 132);
  CHECK(large.grid.x == 132);
  CHECK(large.cluster.x == 2);
  CHECK(large.cluster.y == 1);
  CHECK(spec.launch_shape(8192, 6144, 131).grid.x == 130);
  CHECK(spec.launch_shape(300, 6144, 132).grid.x == 4 * 24);  // 3 row tiles -> 2 pairs
  CHECK(spec.launch_shape(1, 100, 132).grid.x == 2);
  CHECK(single.launch_shape(300, 6144, 132).cluster.x == 1);

  // Clusters belong to the bf16 wgmma kernel, of two CTAs.
  GemmSpec three = spec;
  three.sm90.cluster_m = 3;
  CHECK_THROWS_AS(three.source(), Error);
  GemmSpec w4 = spec;
  w4.kernel = GemmKernel::wgmma_w4;
  w4.weights.format = config::WeightFormat::mxfp4;
  CHECK_THROWS_AS(w4.source(), Error);
}

TEST_CASE("gemm wgmma specializations compile for sm_90a: wgmma in the PTX, no spills",
          "[plan][gemm][nvrtc]") {
  constexpr std::string_view kTmaLoad =
      "cp.async.bulk.tensor.2d.shared::cluster.global";  // plain or multicast
  struct Variant {
    GemmSm90Tiling tiling;
    int segments;
    bool has_bias;
  };
  const std::vector<Variant> variants = {
      {{256, 4}, 3, false},    {{256, 4}, 1, true},     {{128, 6}, 3, true}, {{128, 6}, 1, false},
      {{256, 4, 2}, 3, false}, {{128, 6, 2}, 1, true},  {{192, 4}, 3, true}, {{192, 4}, 1, false},
      {{192, 4, 2}, 3, true},  {{192, 4, 2}, 1, false}, {{160, 5}, 3, true}, {{160, 5}, 1, false}};
  for (const Variant& variant : variants) {
    GemmSpec spec{.segments = variant.segments, .has_bias = variant.has_bias};
    spec.kernel = GemmKernel::wgmma;
    spec.sm90 = variant.tiling;
    const compiler::CompiledKernel kernel = plan_testing::compile_sm90a_gemm(spec.source());
    const compiler::ResourceUsage& usage = kernel.resources;
    std::printf(
        "gemm_sm90 block_n %d stages %d cluster %d segments %d bias %d: %3d registers, %d spill bytes, %d "
        "stack bytes, %d static smem, %d dynamic smem\n",
        spec.sm90.block_n, spec.sm90.stages, spec.sm90.cluster_m, spec.segments, spec.has_bias,
        usage.registers, usage.spill_bytes(), usage.stack_bytes, usage.shared_bytes,
        spec.dynamic_shared_bytes());
    CHECK(kernel.lowered_name.find("gemm_sm90_kernel") != std::string::npos);
    const std::string wgmma = "wgmma.mma_async.sync.aligned.m64n" + std::to_string(spec.sm90.block_n) + "k16";
    CHECK(kernel.ptx.find(wgmma) != std::string::npos);
    // Clusters: W by multicast, releases on both CTAs' barriers.
    const bool clustered = spec.sm90.cluster_m > 1;
    CHECK((kernel.ptx.find(".multicast::cluster") != std::string::npos) == clustered);
    CHECK((kernel.ptx.find("mapa.shared::cluster") != std::string::npos) == clustered);
    // 192-wide tiles over several segments load W in 32-row pieces: one TMA load per piece and the A
    // slice per slot, against one W load otherwise.
    const int loads = count_in(kernel.ptx, std::string(kTmaLoad), 0, std::string::npos);
    const bool pieces = spec.segments > 1 && gemm_sm90_tiles_straddle(spec.sm90.block_n);
    CHECK(loads == (pieces ? 1 + spec.sm90.block_n / spec.sm90.cluster_m / kGemmSm90WPieceRows : 2));
    CHECK(usage.spill_bytes() == 0);
  }
  // The header compiles for sm_80 too (the body is compiled out: one build covers every template), but
  // the plan never picks it there.
  GemmSpec spec{.segments = 1};
  spec.kernel = GemmKernel::wgmma;
  const compiler::CompiledKernel sm80 =
      plan_testing::source_tree_compiler().compile(spec.source(), compiler::CompileOptions{kSm80});
  CHECK(sm80.ptx.find("wgmma") == std::string::npos);
}
