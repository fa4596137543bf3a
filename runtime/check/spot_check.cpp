#include "check/spot_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/fp8.hpp"
#include "driver/cuda_api.hpp"
#include "driver/stream.hpp"
#include "io/layer_weights.hpp"
#include "reference/bf16.hpp"
#include "reference/compare.hpp"
#include "reference/layer.hpp"

namespace attnplan::check {

namespace {

using Bits = std::vector<std::uint16_t>;

void download(void* host, CUdeviceptr from, std::size_t bytes) {
  driver::check(driver::api().cuMemcpyDtoH(host, from, bytes), "cuMemcpyDtoH");
}

CUdeviceptr address(const void* pointer) {
  return reinterpret_cast<CUdeviceptr>(pointer);
}

// A pool as the reference reads it: bf16 values, or an fp8 pool's codes times its scale.
std::vector<double> pool_values(CUdeviceptr pool, std::size_t elements, bool fp8, float scale) {
  if (fp8) {
    std::vector<std::uint8_t> codes(elements);
    download(codes.data(), pool, elements);
    return core::fp8_e4m3_to_doubles(codes, scale);
  }
  Bits bits(elements);
  download(bits.data(), pool, elements * 2);
  return core::bf16_to_doubles(bits);
}

}  // namespace

bool SpotCheck::passed() const {
  return attention_unwritten == 0 && output_unwritten == 0 && output_non_finite == 0 &&
         relative_l2 <= tolerance;  // false for a NaN error too
}

std::vector<std::int64_t> spot_rows(const reference::Batch& batch, int max_rows) {
  if (max_rows < 1)
    throw Error(Stage::input, fmt::format("spot check: max_rows {}; it must be >= 1", max_rows));
  const std::size_t limit = static_cast<std::size_t>(max_rows);
  std::set<std::int64_t> rows;
  // Each sequence's first row (the shortest context) and last (the longest, where a mask or a tail
  // goes wrong first), sequence by sequence.
  for (int s = 0; s < batch.num_seqs() && rows.size() < limit; ++s) {
    const int first = batch.query_starts[s], end = batch.query_starts[s + 1];
    if (first == end) continue;
    rows.insert(first);
    if (rows.size() < limit) rows.insert(end - 1);
  }
  // Then rows spread over the chunk: the middles of `limit` equal shares.
  const std::int64_t tokens = batch.query_starts.empty() ? 0 : batch.query_starts.back();
  for (std::int64_t share = 0; share < max_rows && rows.size() < limit && tokens > 0; ++share)
    rows.insert((2 * share + 1) * tokens / (2 * std::int64_t{max_rows}));
  return {rows.begin(), rows.end()};
}

SpotCheck spot_check(const plan::PrefillPlan& plan, const LayerCase& layer, const plan::ExecuteArgs& args,
                     int max_rows, double tolerance) {
  const config::AttentionConfig& config = layer.config;
  const int tokens = layer.num_tokens();
  const std::size_t hq = static_cast<std::size_t>(config.query_heads);
  const std::size_t hkv = static_cast<std::size_t>(config.kv_heads);
  const std::size_t d = static_cast<std::size_t>(config.head_dim);
  const std::size_t dv = static_cast<std::size_t>(config.value_head_dim);
  SpotCheck result;
  result.tolerance = tolerance;
  result.rows = spot_rows(layer.batch, max_rows);
  const std::size_t count = result.rows.size();

  const driver::CudaApi& cu = driver::api();
  driver::Stream stream = driver::Stream::create();
  const plan::WorkspaceLayout layout = plan.workspace_layout(tokens);
  const CUdeviceptr workspace = address(args.workspace);
  const std::size_t attention_elements = std::size_t(tokens) * hq * dv;
  const std::size_t output_elements = std::size_t(tokens) * static_cast<std::size_t>(config.hidden_size);
  driver::check(
      cu.cuMemsetD8Async(workspace + layout.attention, 0xFF, attention_elements * 2, stream.handle()),
      "cuMemsetD8Async");
  driver::check(cu.cuMemsetD8Async(address(args.output), 0xFF, output_elements * 2, stream.handle()),
                "cuMemsetD8Async");

  // The queries as attention reads them: after the postprocess stage, or after a q|k|v GEMM that ran it in
  // its epilogue (then there is no postprocess stage); q is the first hq * d columns of each q|k|v row.
  Bits queries(count * hq * d), attention(attention_elements);
  const std::size_t row_bytes = static_cast<std::size_t>(layout.qkv_row_width) * 2;
  plan.execute(args, stream.handle(), [&](plan::StageKind stage, const plan::WorkspaceLayout& at) {
    if (stage == plan::StageKind::qkv_projection || stage == plan::StageKind::qkv_postprocess) {
      stream.synchronize();
      for (std::size_t i = 0; i < count; ++i) {
        download(&queries[i * hq * d],
                 workspace + at.qkv + static_cast<std::size_t>(result.rows[i]) * row_bytes, hq * d * 2);
      }
    } else if (stage == plan::StageKind::attention) {
      stream.synchronize();
      download(attention.data(), workspace + at.attention, attention_elements * 2);
    }
  });
  stream.synchronize();
  Bits output(output_elements);
  download(output.data(), address(args.output), output_elements * 2);

  // The reference reads the pools as the run left them: the prefix as uploaded, the chunk as stored.
  const bool fp8 = config.kv_cache.dtype == config::KvCacheDtype::fp8_e4m3;
  const int block_size = config.kv_cache.block_size;
  reference::PagedKvCache cache = reference::PagedKvCache::filled(
      args.cache.num_blocks, block_size, config.kv_heads, config.head_dim, config.value_head_dim);
  const std::size_t slots = std::size_t(args.cache.num_blocks) * static_cast<std::size_t>(block_size);
  cache.key.data = pool_values(address(args.cache.key_cache), slots * hkv * d, fp8, args.cache.k_scale);
  cache.value.data = pool_values(address(args.cache.value_cache), slots * hkv * dv, fp8, args.cache.v_scale);
  const reference::Tensor q_rows =
      reference::tensor_from_bf16(queries, {std::int64_t(count), std::int64_t(hq), std::int64_t(d)});
  const std::vector<double> sinks =
      layer.weights.sinks ? io::to_doubles(*layer.weights.sinks) : std::vector<double>{};
  // Rounded to bf16, as the GPU stores it: like with like.
  const reference::Tensor want = reference::round_to_bf16(
      reference::attention_rows(q_rows, result.rows, tokens, cache, layer.batch, layer.spans, config, sinks));

  std::vector<double> got;
  got.reserve(count * hq * dv);
  for (const std::int64_t row : result.rows) {
    for (std::size_t i = 0; i < hq * dv; ++i)
      got.push_back(core::bf16_to_float(attention[static_cast<std::size_t>(row) * hq * dv + i]));
  }
  result.relative_l2 = reference::relative_l2_error(want.data, got);
  result.attention_unwritten =
      static_cast<std::size_t>(std::count(attention.begin(), attention.end(), kPoisonBits));
  for (const std::uint16_t bits : output) {
    if (bits == kPoisonBits) {
      ++result.output_unwritten;
    } else if (!std::isfinite(core::bf16_to_float(bits))) {
      ++result.output_non_finite;
    }
  }
  return result;
}

}  // namespace attnplan::check
