#include "plan/heuristics.hpp"

#include "support/catch.hpp"

using namespace attnplan::plan;

TEST_CASE("vector width is the largest of 8, 4, 2, 1 dividing the extent", "[plan][heuristics]") {
  CHECK(vector_width_for(4096) == 8);
  CHECK(vector_width_for(2884) == 4);
  CHECK(vector_width_for(90) == 2);
  CHECK(vector_width_for(81) == 1);
}

TEST_CASE("rmsnorm tiling covers the row with whole warps and bounded registers", "[plan][heuristics]") {
  for (int hidden : {8, 64, 896, 2880, 3072, 4096, 5120, 5376, 8192, 16384, 65536}) {
    const RmsNormTiling tiling = choose_rmsnorm_tiling(hidden);
    INFO("hidden_size " << hidden);
    CHECK(tiling.threads % 32 == 0);
    CHECK(tiling.threads >= 32);
    CHECK(tiling.threads <= 1024);
    CHECK(hidden % tiling.vector == 0);
    CHECK(tiling.threads * tiling.vectors_per_thread * tiling.vector >= hidden);
    // No thread is idle for a whole pass unless the row is shorter than a warp of vectors.
    CHECK((tiling.threads * (tiling.vectors_per_thread - 1)) * tiling.vector < hidden);
    CHECK(tiling.vectors_per_thread <= 16);
  }
  // Four 16-byte vectors a thread in flight, from at least 4 warps.
  CHECK(choose_rmsnorm_tiling(4096).threads == 128);
  CHECK(choose_rmsnorm_tiling(4096).vectors_per_thread == 4);
  CHECK(choose_rmsnorm_tiling(16384).threads == 512);
  CHECK(choose_rmsnorm_tiling(2048).threads == 128);  // 2 vectors a thread: not fewer than 4 warps
  CHECK(choose_rmsnorm_tiling(2048).vectors_per_thread == 2);
  CHECK(choose_rmsnorm_tiling(896).threads == 128);  // 112 vectors: one pass, 16 threads idle
  CHECK(choose_rmsnorm_tiling(64).threads == 32);
  CHECK(choose_rmsnorm_tiling(65536).vectors_per_thread == 8);  // at 1024 threads, more vectors each
}

TEST_CASE("kv store tiling sizes blocks to the row and batches short rows", "[plan][heuristics]") {
  const KvStoreTiling llama = choose_kv_store_tiling(8, 128, 128);  // 128 vectors per row
  CHECK(llama.threads == 128);
  CHECK(llama.tokens_per_block == 2);

  const KvStoreTiling mqa = choose_kv_store_tiling(1, 64, 64);  // 8 vectors per row
  CHECK(mqa.threads == 32);
  CHECK(mqa.tokens_per_block == 8);

  const KvStoreTiling wide = choose_kv_store_tiling(16, 256, 256);  // 512 vectors per row
  CHECK(wide.threads == 512);
  CHECK(wide.tokens_per_block == 1);

  const KvStoreTiling odd = choose_kv_store_tiling(3, 80, 36);  // value rows narrower than key rows
  CHECK(odd.threads % 32 == 0);
  CHECK(odd.threads >= 3 * 80 / 8);
}
