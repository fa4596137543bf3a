#include "reference/kv_store.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "core/error.hpp"
#include "core/fp8.hpp"

namespace attnplan::reference {
namespace {

void fail(std::string message) {
  throw Error(Stage::input, std::move(message));
}

void check_shapes(const Tensor& key, const Tensor& value, const PagedKvCache& cache) {
  if (key.rank() != 3)
    fail(fmt::format("key must be [tokens, kv_heads, head_dim], got [{}]", fmt::join(key.shape, ", ")));
  if (value.rank() != 3) {
    fail(fmt::format("value must be [tokens, kv_heads, value_head_dim], got [{}]",
                     fmt::join(value.shape, ", ")));
  }
  if (cache.key.rank() != 4 || cache.value.rank() != 4) {
    fail(fmt::format("cache key and value must be [num_blocks, block_size, kv_heads, dim], got [{}] and [{}]",
                     fmt::join(cache.key.shape, ", "), fmt::join(cache.value.shape, ", ")));
  }
  if (value.extent(0) != key.extent(0) || value.extent(1) != key.extent(1)) {
    fail(fmt::format("key [{}] and value [{}] disagree on tokens or kv_heads", fmt::join(key.shape, ", "),
                     fmt::join(value.shape, ", ")));
  }
  if (cache.value.extent(0) != cache.key.extent(0) || cache.value.extent(1) != cache.key.extent(1)) {
    fail(fmt::format("cache key [{}] and value [{}] disagree on num_blocks or block_size",
                     fmt::join(cache.key.shape, ", "), fmt::join(cache.value.shape, ", ")));
  }
  if (cache.key.extent(2) != key.extent(1) || cache.key.extent(3) != key.extent(2)) {
    fail(fmt::format("key rows [{}, {}] do not match the cache's [kv_heads, head_dim] = [{}, {}]",
                     key.extent(1), key.extent(2), cache.key.extent(2), cache.key.extent(3)));
  }
  if (cache.value.extent(2) != value.extent(1) || cache.value.extent(3) != value.extent(2)) {
    fail(fmt::format("value rows [{}, {}] do not match the cache's [kv_heads, value_head_dim] = [{}, {}]",
                     value.extent(1), value.extent(2), cache.value.extent(2), cache.value.extent(3)));
  }
  if (cache.block_size() <= 0) fail(fmt::format("block_size is {}; it must be positive", cache.block_size()));
  if (cache.fp8) {
    for (const auto& [name, scale] :
         {std::pair{"k_scale", cache.fp8->k_scale}, std::pair{"v_scale", cache.fp8->v_scale}}) {
      if (!std::isfinite(scale) || scale <= 0.0f)
        fail(fmt::format("fp8 cache {} is {}; it must be finite and > 0", name, scale));
    }
  }
}

}  // namespace

PagedKvCache PagedKvCache::filled(std::int64_t num_blocks, int block_size, int kv_heads, int head_dim,
                                  int value_head_dim, double fill) {
  PagedKvCache cache{Tensor({num_blocks, block_size, kv_heads, head_dim}),
                     Tensor({num_blocks, block_size, kv_heads, value_head_dim})};
  std::fill(cache.key.data.begin(), cache.key.data.end(), fill);
  std::fill(cache.value.data.begin(), cache.value.data.end(), fill);
  return cache;
}

std::vector<std::int64_t> kv_store(const Tensor& key, const Tensor& value, const Batch& batch,
                                   PagedKvCache& cache) {
  check_shapes(key, value, cache);
  const std::int64_t num_tokens = key.extent(0);
  const std::vector<TokenPosition> positions = token_positions(batch, num_tokens);

  // Every slot first, so that a bad batch writes nothing (spec section 8).
  std::vector<std::int64_t> slots(static_cast<std::size_t>(num_tokens));
  std::unordered_map<std::int64_t, std::int64_t> row_of_slot;
  for (std::int64_t row = 0; row < num_tokens; ++row) {
    const TokenPosition& token = positions[static_cast<std::size_t>(row)];
    const std::int64_t slot =
        slot_of(batch, token.seq, token.position, cache.block_size(), cache.num_blocks());
    const auto [existing, inserted] = row_of_slot.emplace(slot, row);
    if (!inserted) {
      const TokenPosition& first = positions[static_cast<std::size_t>(existing->second)];
      fail(fmt::format(
          "token rows {} (sequence {}, position {}) and {} (sequence {}, position {}) both map to "
          "cache slot {}: their block tables share a page",
          existing->second, first.seq, first.position, row, token.seq, token.position, slot));
    }
    slots[static_cast<std::size_t>(row)] = slot;
  }

  // In the [num_blocks * block_size, kv_heads * dim] view of the cache, a slot is one row, and so is a token
  // in the [tokens, kv_heads * dim] view of k and v.
  const std::int64_t key_width = key.extent(1) * key.extent(2);
  const std::int64_t value_width = value.extent(1) * value.extent(2);
  for (std::int64_t row = 0; row < num_tokens; ++row) {
    const std::int64_t slot = slots[static_cast<std::size_t>(row)];
    const auto key_row = key.data.begin() + row * key_width;
    const auto value_row = value.data.begin() + row * value_width;
    if (cache.fp8) {
      const KvFp8Scales scales = *cache.fp8;
      std::transform(key_row, key_row + key_width, cache.key.data.begin() + slot * key_width,
                     [&](double x) { return fp8_kv_value(x, scales.k_scale); });
      std::transform(value_row, value_row + value_width, cache.value.data.begin() + slot * value_width,
                     [&](double x) { return fp8_kv_value(x, scales.v_scale); });
    } else {
      std::copy_n(key_row, key_width, cache.key.data.begin() + slot * key_width);
      std::copy_n(value_row, value_width, cache.value.data.begin() + slot * value_width);
    }
  }
  return slots;
}

double fp8_kv_value(double value, float scale) {
  return core::fp8_e4m3_to_double(core::quantize_kv_fp8(static_cast<float>(value), scale)) * scale;
}

}  // namespace attnplan::reference
