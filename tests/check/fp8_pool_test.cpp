#include "check/fp8_pool.hpp"

#include <random>

#include "core/bf16.hpp"
#include "core/fp8.hpp"
#include "support/catch.hpp"

using namespace attnplan;

TEST_CASE("an fp8 pool holds each element's store code, NaN slots the chosen code", "[check][fp8]") {
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<std::uint16_t> pool(257);
  for (std::uint16_t& bits : pool) bits = core::float_to_bf16(normal(random));
  pool[5] = 0xFFFF;  // the layer check's poison
  pool[9] = 0x7FC0;  // a quiet NaN
  const float scale = 0.37f;

  const std::vector<std::uint8_t> codes = check::quantize_kv_pool_fp8(pool, scale);
  const std::vector<std::uint8_t> poisoned = check::quantize_kv_pool_fp8(pool, scale, 0xFF);
  REQUIRE(codes.size() == pool.size());
  REQUIRE(poisoned.size() == pool.size());
  for (std::size_t i = 0; i < pool.size(); ++i) {
    INFO(i);
    if (i == 5 || i == 9) {
      CHECK(codes[i] == 0x7F);
      CHECK(poisoned[i] == 0xFF);
    } else {
      CHECK(codes[i] == core::quantize_kv_fp8(core::bf16_to_float(pool[i]), scale));
      CHECK(poisoned[i] == codes[i]);
    }
  }
}
