#include "check/layer_check.hpp"

#include "check/device_batch.hpp"
#include "check/device_weights.hpp"
#include "check/fp8_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <span>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/fp8.hpp"
#include "driver/cuda_api.hpp"
#include "driver/event.hpp"
#include "driver/memory.hpp"
#include "driver/stream.hpp"
#include "io/random_projection.hpp"
#include "plan/gemm_fp8.hpp"
#include "reference/bf16.hpp"
#include "reference/compare.hpp"
#include "reference/dequantize.hpp"

namespace attnplan::check {

namespace {

using Bits = std::vector<std::uint16_t>;
using Codes = std::vector<std::uint8_t>;  // an fp8 KV pool

Bits normal_bits(std::size_t count, std::mt19937_64& rng, double mean, double stddev) {
  std::normal_distribution<double> normal(mean, stddev);
  Bits bits(count);
  for (auto& value : bits) value = core::double_to_bf16(normal(rng));
  return bits;
}

io::HostTensor bf16(std::vector<std::int64_t> shape, std::mt19937_64& rng, double mean, double stddev) {
  std::int64_t count = 1;
  for (auto extent : shape) count *= extent;
  const Bits bits = normal_bits(static_cast<std::size_t>(count), rng, mean, stddev);
  return io::bf16_tensor(std::move(shape), bits);
}

// The columns [begin, begin + width) of each row of a [rows, row_width] bf16 matrix, as doubles.
std::vector<double> columns(const Bits& rows, std::size_t row_width, std::size_t begin, std::size_t width) {
  const std::size_t count = row_width == 0 ? 0 : rows.size() / row_width;
  std::vector<double> values;
  values.reserve(count * width);
  for (std::size_t r = 0; r < count; ++r) {
    for (std::size_t c = 0; c < width; ++c)
      values.push_back(core::bf16_to_float(rows[r * row_width + begin + c]));
  }
  return values;
}

driver::DeviceBuffer upload(const Bits& bits) {
  return driver::DeviceBuffer::from_host(bits);
}

}  // namespace

InitialKvPools::InitialKvPools(const LayerCase& of) : layer(of) {
  if (layer.fp8) {  // the pools' only NaNs are the poison (their data is random and finite)
    key_codes = quantize_kv_pool_fp8(layer.key_cache, layer.fp8->k_scale, kPoisonCode);
    value_codes = quantize_kv_pool_fp8(layer.value_cache, layer.fp8->v_scale, kPoisonCode);
  }
}

std::span<const std::byte> InitialKvPools::key() const {
  return layer.fp8 ? std::as_bytes(std::span(key_codes)) : std::as_bytes(std::span(layer.key_cache));
}

std::span<const std::byte> InitialKvPools::value() const {
  return layer.fp8 ? std::as_bytes(std::span(value_codes)) : std::as_bytes(std::span(layer.value_cache));
}

LayerCase random_case(const config::AttentionConfig& config, const Scenario& scenario) {
  if (scenario.tokens < 1 || scenario.seqs < 1 || scenario.seqs > scenario.tokens || scenario.prefix < 0) {
    throw Error(Stage::input,
                fmt::format("scenario: {} tokens over {} sequences with prefix {} (need 1 <= seqs "
                            "<= tokens, prefix >= 0)",
                            scenario.tokens, scenario.seqs, scenario.prefix));
  }
  if (scenario.tokens > config.max_tokens) {
    throw Error(Stage::input, fmt::format("--tokens {}: more than the config's max_tokens {}",
                                          scenario.tokens, config.max_tokens));
  }
  if (scenario.bidirectional && !config.bidirectional_spans) {
    throw Error(Stage::input,
                "scenario: bidirectional needs the config's bidirectional_spans (a span over each chunk)");
  }
  std::mt19937_64 rng(scenario.seed);
  LayerCase layer;
  layer.config = config;
  const int hidden = config.hidden_size, hq = config.query_heads, hkv = config.kv_heads;
  const int d = config.head_dim, dv = config.value_head_dim;

  // The batch: a random split of the tokens, prefixes, and pages drawn from a shuffled pool.
  std::vector<int> chunk = scenario.chunk_lens;
  if (chunk.empty()) {
    std::vector<int> cuts(scenario.tokens - 1);
    std::iota(cuts.begin(), cuts.end(), 1);
    std::shuffle(cuts.begin(), cuts.end(), rng);
    cuts.resize(scenario.seqs - 1);
    std::sort(cuts.begin(), cuts.end());
    int previous = 0;
    for (int cut : cuts) {
      chunk.push_back(cut - previous);
      previous = cut;
    }
    chunk.push_back(scenario.tokens - previous);
  }
  std::vector<int> context = scenario.context_lens;
  if (context.empty()) {
    for (std::size_t s = 0; s < chunk.size(); ++s)
      context.push_back(scenario.prefix > 0 ? scenario.prefix + 7 * int(s) : 0);
  }
  if (context.size() != chunk.size())
    throw Error(Stage::input, "scenario: context_lens and chunk_lens differ in length");
  const int block_size = config.kv_cache.block_size;
  int max_blocks = 1, total_blocks = 0;
  for (std::size_t s = 0; s < chunk.size(); ++s) {
    // The KV pool is built on the host and copied whole to the device, and the double-precision reference
    // reads every position: a sequence longer than kMaxScenarioPositions is refused before anything is
    // built rather than ending in std::bad_alloc (verify --prefix 99999999 did).
    const long long positions = static_cast<long long>(context[s]) + chunk[s];
    if (positions > kMaxScenarioPositions) {
      throw Error(Stage::input,
                  fmt::format("scenario: sequence {} would hold {} positions (prefix {} + chunk {}), more "
                              "than the {} a scenario's KV pool and reference are built for",
                              s, positions, context[s], chunk[s], kMaxScenarioPositions));
    }
    const int blocks = static_cast<int>((positions + block_size - 1) / block_size);
    max_blocks = std::max(max_blocks, blocks);
    total_blocks += blocks;
  }
  layer.num_blocks = total_blocks + 3;  // spare pages nobody owns: they must stay untouched
  std::vector<int> pool(layer.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  layer.batch.max_blocks_per_seq = max_blocks;
  layer.batch.query_starts = {0};
  std::size_t next = 0;
  for (std::size_t s = 0; s < chunk.size(); ++s) {
    layer.batch.query_starts.push_back(layer.batch.query_starts.back() + chunk[s]);
    layer.batch.context_lens.push_back(context[s]);
    const int blocks = (context[s] + chunk[s] + block_size - 1) / block_size;
    for (int b = 0; b < max_blocks; ++b) layer.batch.block_tables.push_back(b < blocks ? pool[next++] : -1);
    layer.max_query_len = std::max(layer.max_query_len, chunk[s]);
  }
  if (config.bidirectional_spans) {
    // One span per sequence inside its chunk (Gemma 3 image tokens), where the chunk is long enough; or
    // one over each whole chunk (scenario.bidirectional).
    layer.spans.offsets = {0};
    for (std::size_t s = 0; s < chunk.size(); ++s) {
      if (scenario.bidirectional && chunk[s] > 0)
        layer.spans.bounds.push_back({context[s], context[s] + chunk[s]});
      else if (!scenario.bidirectional && chunk[s] >= 4)
        layer.spans.bounds.push_back({context[s] + chunk[s] / 4, context[s] + chunk[s] / 2});
      layer.spans.offsets.push_back(static_cast<int>(layer.spans.bounds.size()));
    }
  }

  // Weights and input.
  const double norm_mean = config.input_norm.weight_offset != 0 ? 0.0 : 1.0;
  const double head_norm_mean = config.qkv_norm.weight_offset != 0 ? 0.0 : 1.0;
  io::HostLayerWeights& w = layer.weights;
  w.input_norm = bf16({hidden}, rng, norm_mean, 0.2);
  w.q_proj = bf16({hq * d, hidden}, rng, 0.0, 1.0 / std::sqrt(hidden));
  w.k_proj = bf16({hkv * d, hidden}, rng, 0.0, 1.0 / std::sqrt(hidden));
  w.v_proj = bf16({hkv * dv, hidden}, rng, 0.0, 1.0 / std::sqrt(hidden));
  // Quantized projections: random packed data and sane scales of the same magnitude (io/random_projection).
  const auto quantized = [&](const config::WeightEncoding& encoding, std::int64_t n, std::int64_t k,
                             io::HostTensor& weight, io::QuantizationTensors& quant) {
    if (encoding.format == config::WeightFormat::bf16) return;
    auto random = io::random_projection(encoding, n, k, 1.0 / std::sqrt(double(k)), rng());
    weight = std::move(random.weight);
    quant = std::move(random.quant);
  };
  quantized(config.projection.qkv, hq * d, hidden, w.q_proj, w.q_quant);
  quantized(config.projection.qkv, hkv * d, hidden, w.k_proj, w.k_quant);
  quantized(config.projection.qkv, hkv * dv, hidden, w.v_proj, w.v_quant);
  if (config.qkv_bias) {
    w.q_bias = bf16({hq * d}, rng, 0.0, 0.5);
    w.k_bias = bf16({hkv * d}, rng, 0.0, 0.5);
    w.v_bias = bf16({hkv * dv}, rng, 0.0, 0.5);
  }
  if (config.qkv_norm.query) w.q_norm = bf16({d}, rng, head_norm_mean, 0.2);
  if (config.qkv_norm.key) w.k_norm = bf16({d}, rng, head_norm_mean, 0.2);
  w.o_proj = bf16({hidden, hq * dv}, rng, 0.0, 1.0 / std::sqrt(hq * dv));
  quantized(config.projection.output, hidden, hq * dv, w.o_proj, w.o_quant);
  if (config.output_bias) w.o_bias = bf16({hidden}, rng, 0.0, 0.5);
  if (config.sinks) {
    io::HostTensor sinks{io::Dtype::f32, {hq}, std::vector<std::uint8_t>(std::size_t(hq) * 4)};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int h = 0; h < hq; ++h) {
      const float value = normal(rng);
      std::memcpy(sinks.bytes.data() + 4 * h, &value, 4);
    }
    w.sinks = sinks;
  }
  layer.input = normal_bits(std::size_t(layer.num_tokens()) * hidden, rng, 0.0, 1.0);

  // The pools: the cached prefix holds random values, every other slot is poisoned.
  const std::size_t key_row = std::size_t(hkv) * d, value_row = std::size_t(hkv) * dv;
  layer.key_cache.assign(std::size_t(layer.num_blocks) * block_size * key_row, kPoisonBits);
  layer.value_cache.assign(std::size_t(layer.num_blocks) * block_size * value_row, kPoisonBits);
  for (std::size_t s = 0; s < chunk.size(); ++s) {
    for (int p = 0; p < context[s]; ++p) {
      const std::size_t slot =
          std::size_t(layer.batch.block_tables[s * max_blocks + p / block_size]) * block_size +
          p % block_size;
      const Bits k = normal_bits(key_row, rng, 0.0, 1.0), v = normal_bits(value_row, rng, 0.0, 1.0);
      std::copy(k.begin(), k.end(), layer.key_cache.begin() + slot * key_row);
      std::copy(v.begin(), v.end(), layer.value_cache.begin() + slot * value_row);
    }
  }
  if (config.kv_cache.dtype == config::KvCacheDtype::fp8_e4m3) {
    // Random weights have no checkpoint scales: the config's, else 1 (docs/config.md).
    layer.fp8 = reference::KvFp8Scales{static_cast<float>(config.kv_cache.k_scale.value_or(1.0)),
                                       static_cast<float>(config.kv_cache.v_scale.value_or(1.0))};
  }
  return layer;
}

reference::LayerWeights reference_weights(const LayerCase& layer) {
  const io::HostLayerWeights& w = layer.weights;
  const config::Projection& projection = layer.config.projection;
  const std::int64_t hidden = layer.config.hidden_size;
  const std::int64_t q_rows = std::int64_t{layer.config.query_heads} * layer.config.head_dim;
  const std::int64_t k_rows = std::int64_t{layer.config.kv_heads} * layer.config.head_dim;
  const std::int64_t v_rows = std::int64_t{layer.config.kv_heads} * layer.config.value_head_dim;
  const std::int64_t o_columns = std::int64_t{layer.config.query_heads} * layer.config.value_head_dim;
  auto vector = [](const std::optional<io::HostTensor>& t) {
    return t ? io::to_doubles(*t) : std::vector<double>{};
  };
  reference::LayerWeights out;
  out.input_norm = io::to_doubles(w.input_norm);
  out.q_proj = reference::dequantize(projection.qkv, w.q_proj, w.q_quant, q_rows, hidden);
  out.k_proj = reference::dequantize(projection.qkv, w.k_proj, w.k_quant, k_rows, hidden);
  out.v_proj = reference::dequantize(projection.qkv, w.v_proj, w.v_quant, v_rows, hidden);
  out.q_bias = vector(w.q_bias);
  out.k_bias = vector(w.k_bias);
  out.v_bias = vector(w.v_bias);
  out.q_norm = vector(w.q_norm);
  out.k_norm = vector(w.k_norm);
  out.o_proj = reference::dequantize(projection.output, w.o_proj, w.o_quant, hidden, o_columns);
  out.o_bias = vector(w.o_bias);
  out.sinks = vector(w.sinks);
  return out;
}

bool Report::passed() const {
  if (unwritten != 0 || cache_slots_damaged != 0) return false;
  return std::all_of(stages.begin(), stages.end(), [](const StageResult& s) { return s.passed(); });
}

Report run_case(const plan::PrefillPlan& plan, const LayerCase& layer, double tolerance) {
  const config::AttentionConfig& config = layer.config;
  const io::HostLayerWeights& w = layer.weights;
  const int tokens = layer.num_tokens();
  const int hidden = config.hidden_size, hq = config.query_heads, hkv = config.kv_heads;
  const int d = config.head_dim, dv = config.value_head_dim;

  driver::DeviceBuffer input = upload(layer.input);
  driver::DeviceBuffer output(std::size_t(tokens) * hidden * 2);
  const DeviceWeights weights = upload_weights(config, w);
  plan::ExecuteArgs args;
  args.weights = weights.view;
  // An fp8 cache holds the codes of the prefix (as the fp8 store would have written them) and 0xFF, a
  // NaN code the store never writes from finite values, everywhere else.
  const std::optional<reference::KvFp8Scales>& fp8 = layer.fp8;
  // The pools' first bytes, uploaded here and again before the unobserved run below.
  const InitialKvPools pools(layer);
  const Codes& key_codes = pools.key_codes;
  const Codes& value_codes = pools.value_codes;
  const std::span<const std::byte> key_pool = pools.key();
  const std::span<const std::byte> value_pool = pools.value();
  driver::DeviceBuffer key_cache = driver::DeviceBuffer::from_host(key_pool);
  driver::DeviceBuffer value_cache = driver::DeviceBuffer::from_host(value_pool);
  const DeviceBatch device_batch(layer.batch, layer.spans, config.bidirectional_spans);
  driver::DeviceBuffer workspace(plan.workspace_bytes(tokens));

  args.input = input.data<const void>();
  args.output = output.data<void>();
  args.cache = {key_cache.data<void>(), value_cache.data<void>(), layer.num_blocks};
  if (fp8) {
    args.cache.k_scale = fp8->k_scale;
    args.cache.v_scale = fp8->v_scale;
  }
  args.batch = device_batch.description();
  args.workspace = workspace.data<void>();
  args.workspace_bytes = workspace.size_bytes();

  // Run once observing every stage, then again (same inputs, same slots) timed without the observer.
  driver::Stream stream = driver::Stream::create();
  driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");  // pageable uploads are done
  output.fill_bytes_async(0xFF, stream.handle());
  Bits normed, projected, postprocessed, attention;
  const long long row = plan::qkv_row_width(config);
  auto download = [&](std::size_t offset, std::size_t count) {
    Bits bits(count);
    stream.synchronize();
    workspace.download(bits.data(), count * 2, offset);
    return bits;
  };
  plan.execute(args, stream.handle(), [&](plan::StageKind stage, const plan::WorkspaceLayout& layout) {
    switch (stage) {
      case plan::StageKind::input_norm:
        normed = download(layout.normed, std::size_t(tokens) * hidden);
        break;
      case plan::StageKind::qkv_projection:
        projected = download(layout.qkv, std::size_t(tokens) * row);
        break;
      case plan::StageKind::qkv_postprocess:
        postprocessed = download(layout.qkv, std::size_t(tokens) * row);
        break;
      case plan::StageKind::attention:
        attention = download(layout.attention, std::size_t(tokens) * hq * dv);
        break;
      default:
        break;
    }
  });
  if (postprocessed.empty()) postprocessed = projected;  // the plan had nothing to postprocess
  Report report;
  // The pools as they were, so the cache is checked on the unobserved run's own stores, not on what the
  // observed run left there (which would hide a path that stores only when observed, or one that writes
  // k and v elsewhere when nobody observes the workspace: docs/kernels-notes.md, "Session 27").
  stream.synchronize();
  key_cache.upload(key_pool);
  value_cache.upload(value_pool);
  output.fill_bytes_async(0xFF, stream.handle());
  driver::Event start = driver::Event::create(), stop = driver::Event::create();
  start.record(stream.handle());
  plan.execute(args, stream.handle());
  stop.record(stream.handle());
  stream.synchronize();
  report.device_ms = driver::elapsed_ms(start, stop);
  const Bits gpu_output = output.download_all<std::uint16_t>();
  const Bits gpu_keys = fp8 ? Bits{} : key_cache.download_all<std::uint16_t>();
  const Bits gpu_values = fp8 ? Bits{} : value_cache.download_all<std::uint16_t>();
  const Codes gpu_key_codes = fp8 ? key_cache.download_all<std::uint8_t>() : Codes{};
  const Codes gpu_value_codes = fp8 ? value_cache.download_all<std::uint8_t>() : Codes{};

  // The reference on the same bf16 data; its cache starts as the same pools (poison reads as NaN; an fp8
  // pool reads code * scale, and its poison code is NaN too).
  reference::PagedKvCache cache =
      reference::PagedKvCache::filled(layer.num_blocks, config.kv_cache.block_size, hkv, d, dv);
  if (fp8) {
    cache.key.data = core::fp8_e4m3_to_doubles(key_codes, fp8->k_scale);
    cache.value.data = core::fp8_e4m3_to_doubles(value_codes, fp8->v_scale);
    cache.fp8 = fp8;
  } else {
    cache.key.data = core::bf16_to_doubles(layer.key_cache);
    cache.value.data = core::bf16_to_doubles(layer.value_cache);
  }
  const reference::LayerWeights reference_w = reference_weights(layer);
  const reference::LayerStages expected = reference::prefill_layer(
      config, reference_w, reference::tensor_from_bf16(layer.input, {tokens, hidden}), layer.batch,
      layer.spans, cache);
  // A projection with fp8 activations rounds its input to e4m3 per token and 128 channels, a step of 6-12%:
  // where the GPU's stored input differs from the reference's by one bf16 ulp (attention: rel. L2 ~2e-3),
  // codes flip, which alone puts the result ~1e-2 from the chained reference. Such a projection is
  // compared with the reference projection (same quantization, reference::projection_input) of the GPU's
  // own stored input: like with like. The stages before it still face the chained reference.
  const auto fp8_projection = [&](const Bits& stage_input, std::int64_t width,
                                  const config::WeightEncoding& encoding, const reference::Tensor& weight,
                                  const std::vector<double>& bias) {
    const reference::Tensor x = reference::tensor_from_bf16(stage_input, {tokens, width});
    return reference::round_to_bf16(reference::linear(reference::projection_input(x, encoding), weight, bias))
        .data;
  };
  const bool qkv_fp8 = plan::uses_fp8_activations(config.projection.qkv);
  const bool output_fp8 = plan::uses_fp8_activations(config.projection.output);

  auto stage = [&](const char* name, const std::vector<double>& want, const std::vector<double>& got) {
    report.stages.push_back({name, reference::relative_l2_error(want, got), tolerance});
  };
  const std::size_t q_width = std::size_t(hq) * d, k_width = std::size_t(hkv) * d,
                    v_width = std::size_t(hkv) * dv;
  stage("normed", expected.normed.data, core::bf16_to_doubles(normed));
  const auto projection_want = [&](const reference::Tensor& chained, const reference::Tensor& weight,
                                   const std::vector<double>& bias) {
    return qkv_fp8 ? fp8_projection(normed, hidden, config.projection.qkv, weight, bias) : chained.data;
  };
  // A q|k|v GEMM that normalizes and rotates in its epilogue never holds the plain projection: its output
  // is compared as q_final, k_final and v_final only.
  if (!plan.qkv_postprocess_fused(tokens)) {
    stage("q", projection_want(expected.q, reference_w.q_proj, reference_w.q_bias),
          columns(projected, row, 0, q_width));
    stage("k", projection_want(expected.k, reference_w.k_proj, reference_w.k_bias),
          columns(projected, row, q_width, k_width));
    stage("v", projection_want(expected.v, reference_w.v_proj, reference_w.v_bias),
          columns(projected, row, q_width + k_width, v_width));
  }
  stage("q_final", expected.q_final.data, columns(postprocessed, row, 0, q_width));
  stage("k_final", expected.k_final.data, columns(postprocessed, row, q_width, k_width));
  stage("v_final", expected.v_final.data, columns(postprocessed, row, q_width + k_width, v_width));

  // The cache: slots the chunk wrote are compared with the reference; every other slot must be untouched.
  std::vector<double> written_want, written_got;
  auto compare_pool = [&](const Bits& initial, const Bits& gpu, const std::vector<double>& want) {
    for (std::size_t i = 0; i < gpu.size(); ++i) {
      const bool chunk_slot = initial[i] == kPoisonBits && !std::isnan(want[i]);
      if (chunk_slot) {
        if (gpu[i] == kPoisonBits) ++report.cache_slots_damaged;
        written_want.push_back(want[i]);
        written_got.push_back(core::bf16_to_float(gpu[i]));
      } else if (gpu[i] != initial[i]) {
        ++report.cache_slots_damaged;
      }
    }
  };
  // fp8: the same over codes; the written slots compare the values they read as (code * scale).
  auto compare_codes = [&](const Codes& initial, const Codes& gpu, const std::vector<double>& want,
                           float scale) {
    for (std::size_t i = 0; i < gpu.size(); ++i) {
      const bool chunk_slot = initial[i] == kPoisonCode && !std::isnan(want[i]);
      if (chunk_slot) {
        if (gpu[i] == kPoisonCode) ++report.cache_slots_damaged;
        written_want.push_back(want[i]);
        written_got.push_back(core::fp8_e4m3_to_double(gpu[i]) * scale);
      } else if (gpu[i] != initial[i]) {
        ++report.cache_slots_damaged;
      }
    }
  };
  if (fp8) {
    compare_codes(key_codes, gpu_key_codes, cache.key.data, fp8->k_scale);
    compare_codes(value_codes, gpu_value_codes, cache.value.data, fp8->v_scale);
  } else {
    compare_pool(layer.key_cache, gpu_keys, cache.key.data);
    compare_pool(layer.value_cache, gpu_values, cache.value.data);
  }
  stage("kv_cache", written_want, written_got);
  stage("attention", expected.attention.data, core::bf16_to_doubles(attention));
  std::vector<double> got_output = core::bf16_to_doubles(gpu_output);
  report.unwritten = static_cast<std::size_t>(std::count(gpu_output.begin(), gpu_output.end(), kPoisonBits));
  stage("output",
        output_fp8 ? fp8_projection(attention, std::int64_t(hq) * dv, config.projection.output,
                                    reference_w.o_proj, reference_w.o_bias)
                   : expected.output.data,
        got_output);
  // The chained reference too, for the record: bounded by the code flips above (3x the tolerance).
  if (output_fp8) {
    report.stages.push_back(
        {"output_chained", reference::relative_l2_error(expected.output.data, got_output), 3 * tolerance});
  }
  return report;
}

}  // namespace attnplan::check
