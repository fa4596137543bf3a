// The QKV postprocess spec: its heuristic, what it takes from a config, and real NVRTC compiles of the
// specializations every plan in plans/ needs (no GPU).
#include "plan/qkv_postprocess_spec.hpp"

#include <filesystem>
#include <map>
#include <string>

#include "compiler/compiler.hpp"
#include "config/parse.hpp"
#include "plan_testing.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::plan_testing;
using attnplan::plan::QkvPostprocessShape;
using attnplan::plan::QkvPostprocessSpec;
using attnplan::plan::QkvPostprocessTiling;

namespace {

std::filesystem::path plans_dir() {
  return std::filesystem::path(ATTNPLAN_SOURCE_DIR) / "plans";
}

config::AttentionConfig load_plan(const std::string& name) {
  return config::load_file(plans_dir() / (name + ".json"));
}

// Straight from the source tree, so the test sees templates being edited without a rebuild.
std::string argument(const compiler::KernelSource& source, const std::string& name) {
  for (const compiler::TemplateArgument& a : source.arguments) {
    if (a.name == name) return a.value;
  }
  return "<missing>";
}

}  // namespace

TEST_CASE("warp row vectors are the widest that still give every lane a vector", "[plan][qkv_postprocess]") {
  CHECK(plan::warp_row_vector_width(256) == 8);
  CHECK(plan::warp_row_vector_width(128) == 4);
  CHECK(plan::warp_row_vector_width(64) == 2);
  CHECK(plan::warp_row_vector_width(192) == 4);
  CHECK(plan::warp_row_vector_width(96) == 2);
  CHECK(plan::warp_row_vector_width(80) == 2);
  CHECK(plan::warp_row_vector_width(32) == 1);
  CHECK(plan::warp_row_vector_width(1024) == 8);
}

TEST_CASE("qkv postprocess tiling gives each warp a few heads and aligns v vectors",
          "[plan][qkv_postprocess]") {
  // Llama-3.1-8B: 32 q + 8 k rows of 128 -> 8 warps of 5 heads, 8-byte accesses; v untouched.
  const QkvPostprocessTiling llama = plan::choose_qkv_postprocess_tiling(
      {.query_heads = 32, .kv_heads = 8, .head_dim = 128, .value_head_dim = 128, .head_rows = 40});
  CHECK(llama.threads == 256);
  CHECK(llama.head_vector == 4);
  CHECK(llama.value_vector == 1);

  // A small model: 9 rows -> 3 warps of 3 heads.
  const QkvPostprocessTiling small = plan::choose_qkv_postprocess_tiling(
      {.query_heads = 8, .kv_heads = 1, .head_dim = 64, .value_head_dim = 64, .head_rows = 9});
  CHECK(small.threads == 96);
  CHECK(small.head_vector == 2);

  // One row still gets a warp; v normalized with a wide Dv.
  const QkvPostprocessTiling one = plan::choose_qkv_postprocess_tiling({.query_heads = 1,
                                                                        .kv_heads = 1,
                                                                        .head_dim = 256,
                                                                        .value_head_dim = 512,
                                                                        .head_rows = 1,
                                                                        .value_norm = true});
  CHECK(one.threads == 32);
  CHECK(one.value_vector == 8);

  // v starts at column (3 + 1) * 18 = 72, a multiple of 8 but the v width 2 is what fills a warp of 80.
  const QkvPostprocessTiling odd = plan::choose_qkv_postprocess_tiling({.query_heads = 3,
                                                                        .kv_heads = 1,
                                                                        .head_dim = 18,
                                                                        .value_head_dim = 80,
                                                                        .head_rows = 5,
                                                                        .value_norm = true});
  CHECK(odd.head_vector == 1);
  CHECK(odd.value_vector == 2);

  // v at column (5 + 1) * 34 = 204 (a multiple of 4, not 8): Dv 512 would take 8, alignment cuts it to 4.
  const QkvPostprocessTiling misaligned = plan::choose_qkv_postprocess_tiling({.query_heads = 5,
                                                                               .kv_heads = 1,
                                                                               .head_dim = 34,
                                                                               .value_head_dim = 512,
                                                                               .head_rows = 7,
                                                                               .value_norm = true});
  CHECK(misaligned.value_vector == 4);

  for (int rows : {1, 4, 5, 40, 72, 200}) {
    const QkvPostprocessTiling tiling = plan::choose_qkv_postprocess_tiling(
        {.query_heads = rows, .kv_heads = 1, .head_dim = 128, .value_head_dim = 128, .head_rows = rows});
    INFO("rows " << rows);
    CHECK(tiling.threads % 32 == 0);
    CHECK(tiling.threads >= 32);
    CHECK(tiling.threads <= 256);
    CHECK(tiling.threads / 32 <= rows);
  }
}

TEST_CASE("qkv postprocess spec takes norms and RoPE from the config", "[plan][qkv_postprocess]") {
  const QkvPostprocessSpec llama = QkvPostprocessSpec::from_config(load_plan("llama-3.1-8b"));
  CHECK(llama.query_heads == 32);
  CHECK(llama.kv_heads == 8);
  CHECK(llama.head_dim == 128);
  CHECK(llama.rotary_offset == 0);
  CHECK(llama.rotary_dim == 128);
  CHECK(llama.pairing_dim == 128);
  CHECK_FALSE(llama.query_norm);
  CHECK_FALSE(llama.key_norm);
  CHECK_FALSE(llama.value_norm);
  CHECK(llama.head_rows() == 40);
  CHECK(llama.row_width() == (32 + 8 + 8) * 128);

  const QkvPostprocessSpec gemma = QkvPostprocessSpec::from_config(load_plan("gemma-3-27b-global"));
  CHECK(gemma.query_norm);
  CHECK(gemma.key_norm);
  CHECK(gemma.unit_offset);

  const QkvPostprocessSpec qwen3 = QkvPostprocessSpec::from_config(load_plan("qwen3-8b"));
  CHECK(qwen3.query_norm);
  CHECK_FALSE(qwen3.unit_offset);

  const QkvPostprocessSpec phi = QkvPostprocessSpec::from_config(load_plan("phi-4-mini"));
  CHECK(phi.rotary_dim == 96);
  CHECK(phi.pairing_dim == 96);

  const QkvPostprocessSpec gptj = QkvPostprocessSpec::from_config(load_plan("gpt-j-6b"));
  CHECK(gptj.head_dim == 256);
  CHECK(gptj.rotary_dim == 64);
  CHECK(gptj.pairing_dim == 2);
  CHECK(gptj.tiling.head_vector == 8);

  // No RoPE and no norms: nothing to do, and the unused rotary fields are canonical.
  config::AttentionConfig plain = load_plan("llama-3.1-8b");
  plain.rotary.dim = 0;
  plain.rotary.pairing_dim = 0;
  const QkvPostprocessSpec none = QkvPostprocessSpec::from_config(plain);
  CHECK(none.rotary_dim == 0);
  CHECK(none.pairing_dim == 2);
  CHECK_FALSE(none.has_work());

  // Only a v norm: v heads are the only rows, with an aligned v vector.
  plain.qkv_norm.value = true;
  const QkvPostprocessSpec value_only = QkvPostprocessSpec::from_config(plain);
  CHECK(value_only.head_rows() == 8);
  CHECK(value_only.tiling.value_vector == 4);
  CHECK(value_only.row_alignment() == 4);
}

TEST_CASE("qkv postprocess stub names every trait", "[plan][qkv_postprocess]") {
  const compiler::KernelSource source = QkvPostprocessSpec::from_config(load_plan("gpt-j-6b")).source();
  CHECK(source.family == "qkv_postprocess");
  CHECK(source.header == "attnplan/qkv_postprocess.cuh");
  CHECK(argument(source, "rotary_dim") == "64");
  CHECK(argument(source, "pairing_dim") == "2");
  CHECK(argument(source, "query_norm") == "false");
  CHECK(argument(source, "head_vector") == "8");
  const std::string stub = source.render_stub();
  CHECK(stub.find("/*head_dim=*/256") != std::string::npos);
  CHECK(stub.find("attnplan::kernels::qkv_postprocess_kernel<Traits>") != std::string::npos);
  CHECK(source.spec.at("threads") == 256);
}

TEST_CASE(
    "the q|k|v GEMM's epilogue takes the postprocess where its tiles hold whole heads and each pair "
    "lies in one thread's columns",
    "[plan][qkv_postprocess]") {
  // rotate_half at D 128 (half 64): 128- and 256-wide tiles, not the 160 and 192 that split heads.
  const QkvPostprocessSpec llama = QkvPostprocessSpec::from_config(load_plan("llama-3.1-8b"));
  CHECK(llama.fits_gemm_epilogue(256));
  CHECK(llama.fits_gemm_epilogue(128));
  CHECK_FALSE(llama.fits_gemm_epilogue(192));
  CHECK_FALSE(llama.fits_gemm_epilogue(160));
  CHECK(llama.epilogue_traits() ==
        "attnplan::kernels::QkvEpilogueTraits<32, 8, 128, 128, 0, 128, 128, false, false, false, false>");
  CHECK(llama.epilogue_spec().at("rotary_dim") == 128);
  CHECK(llama.epilogue_table_floats() == 64);  // 8 blocks of pairs' a's x 2 rows x a float4
  // GPT-J: interleaved pairs (P2 = 2) of a partial rotary dim at D 256.
  const QkvPostprocessSpec gpt_j = QkvPostprocessSpec::from_config(load_plan("gpt-j-6b"));
  CHECK(gpt_j.fits_gemm_epilogue(256));
  CHECK_FALSE(gpt_j.fits_gemm_epilogue(128));
  CHECK(gpt_j.epilogue_table_floats() == 32);  // 8 rotating blocks x 2 rows x a float2
  // rotate_half over a 256-wide head: 128 table floats a thread, more than fit beside the accumulators.
  QkvPostprocessSpec wide = gpt_j;
  wide.pairing_dim = 256;
  wide.rotary_dim = 256;
  CHECK(wide.epilogue_table_floats() == 128);
  CHECK_FALSE(wide.fits_gemm_epilogue(256));
  wide.rotary_dim = 128;  // pairs across the head, half of them rotated: 64
  CHECK(wide.fits_gemm_epilogue(256));
  // Qwen3: q/k norms and RoPE.
  CHECK(QkvPostprocessSpec::from_config(load_plan("qwen3-8b")).fits_gemm_epilogue(256));

  QkvPostprocessSpec spec = llama;
  spec.rotary_dim = 96;  // Phi-4-mini's half split: half 48, a multiple of 8
  spec.pairing_dim = 96;
  CHECK(spec.fits_gemm_epilogue(256));
  spec.rotary_dim = 12;  // half 6: a pair's partner is in another quad lane's columns
  spec.pairing_dim = 12;
  CHECK_FALSE(spec.fits_gemm_epilogue(256));
  spec.rotary_dim = 64;  // half 32, but an offset of 4 shifts pairs across 8-column blocks
  spec.pairing_dim = 64;
  spec.rotary_offset = 4;
  CHECK_FALSE(spec.fits_gemm_epilogue(256));
  spec.pairing_dim = 2;  // interleaved at an even offset: fine
  CHECK(spec.fits_gemm_epilogue(256));
  spec.rotary_offset = 3;
  CHECK_FALSE(spec.fits_gemm_epilogue(256));

  // The MLA-style rope at the end of a 192-wide head: only 192-wide tiles hold whole heads.
  QkvPostprocessSpec mla = llama;
  mla.head_dim = 192;
  mla.value_head_dim = 192;
  mla.rotary_offset = 128;
  mla.rotary_dim = 64;
  mla.pairing_dim = 2;
  CHECK(mla.fits_gemm_epilogue(192));
  CHECK_FALSE(mla.fits_gemm_epilogue(256));
  // v normalized in the tile needs Dv == D; nothing to do never fits.
  QkvPostprocessSpec value = llama;
  value.value_norm = true;
  CHECK(value.fits_gemm_epilogue(256));
  value.value_head_dim = 64;
  CHECK_FALSE(value.fits_gemm_epilogue(256));
  QkvPostprocessSpec idle = llama;
  idle.rotary_dim = 0;
  CHECK_FALSE(idle.has_work());
  CHECK_FALSE(idle.fits_gemm_epilogue(256));
}

TEST_CASE("qkv postprocess compiles for every plan on sm_80 and sm_90a with no spills",
          "[plan][qkv_postprocess][nvrtc]") {
  // One compile per distinct stub: several plans share a specialization (gpt-oss full/sliding, ...).
  std::map<std::string, std::string> stubs;  // stub -> first plan that needs it
  for (const auto& file : std::filesystem::directory_iterator(plans_dir())) {
    if (file.path().extension() != ".json") continue;
    const QkvPostprocessSpec spec = QkvPostprocessSpec::from_config(config::load_file(file.path()));
    INFO(file.path().filename().string());
    REQUIRE(spec.has_work());  // every plan has RoPE
    stubs.emplace(spec.source().render_stub(), file.path().stem().string());
  }
  REQUIRE(stubs.size() >= 5);
  for (const auto& [stub, name] : stubs) {
    const QkvPostprocessSpec spec = QkvPostprocessSpec::from_config(load_plan(name));
    for (const char* arch : {"sm_80", "sm_90a"}) {
      compiler::CompileOptions options;
      options.arch = *config::parse_arch(arch);
      const compiler::CompiledKernel kernel =
          plan_testing::source_tree_compiler().compile(spec.source(), options);
      const compiler::ResourceUsage& usage = kernel.resources;
      INFO(name << " for " << arch << ": " << usage.registers << " registers, " << usage.stack_bytes
                << " bytes stack, " << usage.shared_bytes << " bytes smem\n"
                << kernel.log);
      CHECK(kernel.lowered_name.rfind("_Z", 0) == 0);
      CHECK(usage.spill_bytes() == 0);
      CHECK(usage.stack_bytes == 0);
      CHECK(usage.registers > 0);
      CHECK(usage.registers <= 64);  // 256-thread blocks: 8 per SM at full occupancy need <= 64
    }
  }
}
