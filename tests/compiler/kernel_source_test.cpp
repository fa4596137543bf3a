#include "compiler/kernel_source.hpp"
#include "support/catch.hpp"
#include "test_kernels.hpp"

TEST_CASE("the stub includes the header and instantiates the kernel with named arguments",
          "[kernel_source]") {
  const auto source = attnplan::testing::kv_store_source(8, 128, 64, 16, 256, 4);
  const std::string stub = source.render_stub();
  CHECK(stub.find("#include \"attnplan/kv_store.cuh\"") != std::string::npos);
  CHECK(stub.find("attnplan::kernels::KvStoreTraits</*kv_heads=*/8, /*head_dim=*/128, /*value_head_dim=*/64, "
                  "/*block_size=*/16, /*threads=*/256, /*tokens_per_block=*/4>") != std::string::npos);
  CHECK(stub.find(
            "template __global__ void attnplan::kernels::kv_store_kernel<Traits>(const Traits::Params);") !=
        std::string::npos);
  CHECK(source.name_expression() == "attnplan::kernels::kv_store_kernel<Traits>");
}

TEST_CASE("the stub is a pure function of the source", "[kernel_source]") {
  const auto a = attnplan::testing::rmsnorm_source(4096, 256, false);
  const auto b = attnplan::testing::rmsnorm_source(4096, 256, false);
  CHECK(a.render_stub() == b.render_stub());
  CHECK(a.render_stub() != attnplan::testing::rmsnorm_source(4096, 256, true).render_stub());
  CHECK(a.render_stub().find("/*unit_offset=*/false") != std::string::npos);
}
