// The fp8 e4m3fn KV cache in the reference (specs/formats.md): kv_store stores what k_q = fp8(k / k_scale)
// reads back as (k_q * k_scale), and attention reads those values. Checked against values worked out by
// hand from the e4m3fn grid.
#include <cmath>
#include <cstdint>
#include <vector>

#include "layer_testing.hpp"
#include "reference/layer.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using attnplan::Stage;
using attnplan::config::AttentionConfig;
using attnplan::reference::attention;
using attnplan::reference::fp8_kv_value;
using attnplan::reference::kv_store;
using attnplan::reference::KvFp8Scales;
using attnplan::reference::PagedKvCache;
using attnplan::reference::Tensor;
using attnplan::reference::testing::one_sequence;
using attnplan::reference::testing::small_config;

TEST_CASE("fp8 KV values: x / scale in fp32, rounded to e4m3fn (nearest even, saturating), times scale",
          "[reference][kv_store][fp8kv]") {
  CHECK(fp8_kv_value(1.0, 0.5f) == 1.0);  // 2 is a code
  // 0.3f / 0.5 = 0.6000000238: in [0.5, 1) the step is 1/16, 9.6 steps round to 10 = 0.625; read 0.3125.
  CHECK(fp8_kv_value(0.3, 0.5f) == 0.3125);
  CHECK(fp8_kv_value(300.0, 0.5f) == 224.0);  // 600 saturates to 448
  CHECK(fp8_kv_value(-300.0, 0.5f) == -224.0);
  // -0.001 / 0.5 = -0.002: subnormal, 1.024 steps of 2^-9 round to 1.
  CHECK(fp8_kv_value(-0.001, 0.5f) == -std::ldexp(1.0, -10));
  CHECK(fp8_kv_value(1e-6, 1.0f) == 0.0);  // below half the smallest subnormal
  // 1.0625 / 1 is the tie between 1 and 1.125: to the even code, 1.
  CHECK(fp8_kv_value(1.0625, 1.0f) == 1.0);
  CHECK(fp8_kv_value(1.1875, 1.0f) == 1.25);
}

TEST_CASE("fp8 kv_store writes the dequantized values into the chunk's slots only",
          "[reference][kv_store][fp8kv]") {
  Tensor key({2, 1, 2});
  Tensor value({2, 1, 2});
  key(0, 0, 0) = 1.0, key(0, 0, 1) = 0.3, key(1, 0, 0) = 300.0, key(1, 0, 1) = -0.001;
  value(0, 0, 0) = 3.0, value(0, 0, 1) = -5.0, value(1, 0, 0) = 0.0, value(1, 0, 1) = 17.0;
  PagedKvCache cache = PagedKvCache::filled(4, 2, 1, 2, 2, -999.0);
  cache.fp8 = KvFp8Scales{0.5f, 4.0f};
  const auto batch = one_sequence(2, 2);
  const std::vector<std::int64_t> slots = kv_store(key, value, batch, cache);
  REQUIRE(slots.size() == 2);
  const std::int64_t page = slots[0] / 2;
  CHECK(cache.key(page, 0, 0, 0) == 1.0);
  CHECK(cache.key(page, 0, 0, 1) == 0.3125);
  CHECK(cache.key(page, 1, 0, 0) == 224.0);
  CHECK(cache.key(page, 1, 0, 1) == -std::ldexp(1.0, -10));
  CHECK(cache.value(page, 0, 0, 0) == 3.0);   // 0.75 is a code
  CHECK(cache.value(page, 0, 0, 1) == -5.0);  // -1.25
  CHECK(cache.value(page, 1, 0, 0) == 0.0);
  CHECK(cache.value(page, 1, 0, 1) == 16.0);  // 4.25: step 0.5 in [4, 8), the tie goes to even 4.0
  for (std::int64_t other = 0; other < 4; ++other) {
    if (other == page) continue;
    CHECK(cache.key(other, 0, 0, 0) == -999.0);
  }

  cache.fp8 = KvFp8Scales{0.0f, 1.0f};
  const attnplan::Error error = expect_error([&] { kv_store(key, value, batch, cache); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.what(), "k_scale is 0; it must be finite and > 0"));
}

TEST_CASE("fp8 attention reads k_q * k_scale and v_q * v_scale", "[reference][attention][fp8kv]") {
  // One head of dim 2, two tokens; query 1 sees keys 0 and 1. Keys 2 and 0.3 (read 2 and 0.3125 with
  // k_scale 0.5); values 3 and 17 (read 3 and 16 with v_scale 4). Scores q . k / sqrt(2) with q = (1, 0).
  const AttentionConfig config = small_config(1, 1, 2, 2);
  Tensor q({2, 1, 2});
  q(0, 0, 0) = 1.0, q(1, 0, 0) = 1.0;
  Tensor key({2, 1, 2});
  key(0, 0, 0) = 2.0, key(1, 0, 0) = 0.3;
  Tensor value({2, 1, 2});
  value(0, 0, 0) = 3.0, value(1, 0, 0) = 17.0;
  PagedKvCache cache = PagedKvCache::filled(4, 2, 1, 2, 2);
  cache.fp8 = KvFp8Scales{0.5f, 4.0f};
  const auto batch = one_sequence(2, 2);
  kv_store(key, value, batch, cache);
  const Tensor out = attention(q, cache, batch, {}, config, {});
  CHECK(out(0, 0, 0) == Approx(3.0).epsilon(1e-15));
  const double e0 = std::exp(2.0 / std::sqrt(2.0)), e1 = std::exp(0.3125 / std::sqrt(2.0));
  CHECK(out(1, 0, 0) == Approx((e0 * 3.0 + e1 * 16.0) / (e0 + e1)).epsilon(1e-13));
  CHECK(out(1, 0, 1) == 0.0);
}
