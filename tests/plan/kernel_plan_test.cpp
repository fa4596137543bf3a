#include "plan/kernel_plan.hpp"

#include "config/parse.hpp"
#include "support/catch.hpp"

using namespace attnplan;

namespace {
config::AttentionConfig llama() {
  return config::load_file(std::string(ATTNPLAN_SOURCE_DIR) + "/plans/llama-3.1-8b.json");
}
}  // namespace

TEST_CASE("the foundation plan is the input norm then the KV store", "[plan]") {
  const plan::KernelPlan kernels = plan::plan_kernels(llama());
  REQUIRE(kernels.kernels.size() == 2);
  CHECK(kernels.kernels[0].stage == plan::StageKind::input_norm);
  CHECK(kernels.kernels[0].name == "input_rmsnorm");
  CHECK(kernels.kernels[1].stage == plan::StageKind::kv_store);
  CHECK(kernels.kernels[1].name == "kv_store");
}

TEST_CASE("specs carry the config's shapes into named template arguments", "[plan]") {
  config::AttentionConfig config = llama();
  const plan::KernelPlan kernels = plan::plan_kernels(config);
  CHECK(kernels.input_norm.hidden_size == 4096);
  CHECK_FALSE(kernels.input_norm.unit_offset);
  CHECK(kernels.kv_store.kv_heads == 8);
  CHECK(kernels.kv_store.head_dim == 128);
  CHECK(kernels.kv_store.block_size == config.kv_cache.block_size);

  const std::string stub = kernels.kernels[0].source.render_stub();
  CHECK(stub.find("/*hidden_size=*/4096") != std::string::npos);
  CHECK(stub.find("/*unit_offset=*/false") != std::string::npos);
  CHECK(stub.find("#include \"attnplan/rmsnorm.cuh\"") != std::string::npos);
  const std::string kv_stub = kernels.kernels[1].source.render_stub();
  CHECK(kv_stub.find("/*kv_heads=*/8") != std::string::npos);
  CHECK(kv_stub.find("/*block_size=*/") != std::string::npos);

  config.input_norm.weight_offset = 1.0;
  config.kv_cache.block_size = 64;
  const plan::KernelPlan gemma_like = plan::plan_kernels(config);
  CHECK(gemma_like.input_norm.unit_offset);
  CHECK(gemma_like.kernels[0].source.render_stub().find("/*unit_offset=*/true") != std::string::npos);
  CHECK(gemma_like.kernels[1].source.render_stub().find("/*block_size=*/64") != std::string::npos);
}
