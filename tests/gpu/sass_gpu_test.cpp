// What ptxas made of the kernels' overlapped schedules, read in their SASS (no ptxas report says it): the
// D 128 attention's softmax between its two wgmma waits, the fp8 GEMM's promotions under the next block's
// wgmmas. Nothing here runs on the GPU; the cases live in test_gpu because they need the toolkit's
// cuobjdump, which the lent GPU machine's toolkit has and CI's and the development machine's lack (test_gpu
// exits 77 there, so CI reports them skipped). plan_testing::disassemble finds cuobjdump and runs it.
#include <algorithm>
#include <cstddef>
#include <string>

#include "compiler/compiler.hpp"
#include "core/error.hpp"
#include "plan/attention_spec.hpp"
#include "plan/gemm_fp8.hpp"
#include "plan/plan_testing.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::plan;
using plan_testing::kSm90a;

// The overlapped schedule (D 128) only pays if ptxas keeps the softmax between the wait for S(i)
// (`WARPGROUP.DEPBAR.LE gsb0, 0x1`) and the wait for P V(i - 1) (`... 0x0`). ptxas moves a wait as early as
// its basic block allows, and until session 29 it placed that second wait ahead of the whole softmax, with
// no report in its log (attention-notes.md, "Session 29"). Only the SASS shows it
// (plan_testing::disassemble).
TEST_CASE("sm_90a attention: the D 128 softmax sits between the two waits in the SASS", "[gpu][sass]") {
  // The plans' D 128 specializations: Llama's (group 4, pages of 16, the gather; pages of 64, TMA), with
  // spans (the bidirectional rows) and with a window and sinks.
  struct Case {
    int block_size;
    bool kv_tma, spans, window_and_sinks;
  };
  for (const Case c : {Case{16, false, false, false}, Case{64, true, false, false},
                       Case{64, true, true, false}, Case{64, true, false, true}}) {
    AttentionSpec spec;
    spec.kernel = AttentionKernel::wgmma_sm90;
    spec.head_dim = spec.value_head_dim = 128;
    spec.group_size = 4;
    spec.block_size = c.block_size;
    spec.has_spans = c.spans;
    spec.has_window = spec.has_sinks = c.window_and_sinks;
    spec.tiling = choose_sm90_attention_tiling(128, 4, false);
    spec.tiling.kv_tma = c.kv_tma;
    REQUIRE(spec.tiling.overlap_softmax);
    INFO(spec.source().spec.dump());
    compiler::CompiledKernel kernel;
    try {
      kernel = plan_testing::source_tree_compiler().compile(spec.source(), compiler::CompileOptions{kSm90a});
    } catch (const Error& error) {
      FAIL(error.what() << "\n" << error.payload());
    }
    const std::string sass = plan_testing::disassemble(kernel);
    // Every wait for an S (0x1: one P V may stay in flight) is followed by the tile's exponentials, at
    // least block_n / 2 per thread, before the wait for that P V (0x0).
    int loops = 0;
    for (std::size_t at = sass.find("WARPGROUP.DEPBAR.LE gsb0, 0x1"); at != std::string::npos;
         at = sass.find("WARPGROUP.DEPBAR.LE gsb0, 0x1", at + 1)) {
      const std::size_t end = sass.find("WARPGROUP.DEPBAR.LE gsb0, 0x0", at);
      REQUIRE(end != std::string::npos);
      CHECK(plan_testing::count_in(sass, "MUFU.EX2", at, end) >= spec.tiling.block_n / 2);
      ++loops;
    }
    CHECK(loops >= 1);
  }
}

// The two partials (kernels-notes.md, "Session 10") pay only if each block's promotion runs while the next
// block's wgmmas are in flight: after each `WARPGROUP.DEPBAR.LE gsb0, 0x1`, a whole partial's FFMAs (64 per
// thread: block_n / 2 of a 64 x 128 warpgroup tile; FADDs with tensor and channel weight scales, whose
// activation scales are per token) before the next wgmma issue or wait. ptxas moved the
// attention kernel's wait without a word (attention-notes.md, "Session 29"), so this reads the SASS too.
TEST_CASE("sm_90a fp8-activation GEMM: each promotion sits under the next block's wgmmas in the SASS",
          "[gpu][sass]") {
  for (auto granularity : {config::Fp8ScaleGranularity::tensor, config::Fp8ScaleGranularity::channel,
                           config::Fp8ScaleGranularity::block}) {
    GemmFp8Spec spec;
    spec.segments = 3;
    spec.granularity = granularity;
    const auto source = spec.source();
    INFO(source.render_stub());
    const auto kernel =
        plan_testing::source_tree_compiler().compile(source, compiler::CompileOptions{kSm90a});
    const std::string sass = plan_testing::disassemble(kernel);
    int waits = 0;
    for (std::size_t at = sass.find("WARPGROUP.DEPBAR.LE gsb0, 0x1"); at != std::string::npos;
         at = sass.find("WARPGROUP.DEPBAR.LE gsb0, 0x1", at + 1)) {
      const std::size_t end =
          std::min(sass.find("WARPGROUP.ARRIVE", at), sass.find("WARPGROUP.DEPBAR", at + 1));
      CHECK(plan_testing::count_in(
                sass, spec.activation_scales() == config::Fp8ActivationScales::token ? "FADD" : "FFMA", at,
                end) >= 64);
      ++waits;
    }
    CHECK(waits >= 2);  // the loop's two halves, and the tail's
  }
}
