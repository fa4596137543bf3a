// Shared pieces of the GPU tests: one Runtime over a private cache ($ATTNPLAN_CACHE_DIR instead when set,
// so that repeated runs compile nothing), the device's primary context, random
// bf16 data, and poison patterns. Every GPU result is compared with the CPU reference.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnplan/gemm_params.h"
#include "check/device_batch.hpp"
#include "check/device_weights.hpp"
#include "check/layer_check.hpp"
#include "compiler/kernel_source.hpp"
#include "config/attention_config.hpp"
#include "config/target.hpp"
#include "driver/context.hpp"
#include "driver/memory.hpp"
#include "driver/module.hpp"
#include "plan/runtime.hpp"
#include "reference/tensor.hpp"
#include "support/temp_dir.hpp"

namespace attnplan::gpu_testing {

// bf16 0xFFFF is a NaN: a poisoned element that a kernel forgot to write can never look valid.
inline constexpr std::uint8_t kPoisonByte = 0xFF;
inline constexpr std::uint16_t kPoisonBits = 0xFFFF;

struct Gpu {
  testing::TempDir cache_dir{"attnplan-gpu-cache"};  // used unless ATTNPLAN_CACHE_DIR is set
  Runtime runtime;
  driver::Context context;

  Gpu();
  plan::PrefillPlan load(const config::AttentionConfig& config);
};

// The process-wide GPU fixture (one context, one cache, created on first use).
Gpu& gpu();

// The device's SMs: the persistent grids of the wgmma GEMM and the sm_90a attention.
int device_multiprocessors();

// The device's architecture as the planner names it (sm_90a on an H100 / H200: the arch-specific target).
config::Arch device_arch();

// A config with the given shapes and defaults for everything else (validated).
config::AttentionConfig make_config(int hidden_size, int query_heads, int kv_heads, int head_dim,
                                    int value_head_dim, int block_size);

// `source` compiled for this device and loaded, once per process (kept until exit), allowing
// `shared_bytes` of dynamic shared memory: a kernel launched on its own, outside a plan.
const driver::Function& kernel_function(const compiler::KernelSource& source, int shared_bytes = 0);

// A small layer (hidden 512, 8 query heads, 2 KV heads, head_dim 64, max_tokens 4096) with `patch`
// merged over it (JSON merge patch; `{}` changes nothing), validated.
config::AttentionConfig config_from(nlohmann::json patch);

// `count` bf16 values drawn from N(mean, stddev), as raw bits.
std::vector<std::uint16_t> random_bf16(std::size_t count, std::mt19937_64& rng, double mean = 0.0,
                                       double stddev = 1.0);

// Uploads `bits` followed by `tail` poison (NaN) elements: a kernel that reads past the end of an operand
// turns its output into NaN instead of silently using a neighbour's data.
driver::DeviceBuffer upload_with_nan_tail(const std::vector<std::uint16_t>& bits, std::size_t tail);

// C [m, n] as doubles from a downloaded [m + 1, ldc] buffer that was poisoned before the launch; CHECKs
// that every element of C was written and that the guard row and the columns [n, ldc) kept their poison.
std::vector<double> checked_output(const std::vector<std::uint16_t>& output, int m, int n, long long ldc);

// A quantized weight W [N = sum of widths, K] on the device in segments along N, each its own
// io::random_projection (seeded seed * 7 + segment) with poison past the end of every buffer, and what the
// reference needs to check a GEMM over it.
struct QuantizedSegments {
  std::vector<driver::DeviceBuffer> buffers;  // weights, scales, zeros, g_idx, scale_2 and biases
  reference::Tensor weight;                   // [N, K]: reference::dequantize of the same bytes
  std::vector<double> bias;                   // [N] (bias_bits given) or empty
};

// Fills params.segments[0 .. widths.size()) (weight, scales, zeros, g_idx, scale_2, bias, bounds) with
// `weights`'s format; packed_integer / affine scales (and MLX biases) are widened to f32 as
// check::upload_weights does. `bias_bits` [N] bf16, or empty for no bias.
QuantizedSegments upload_quantized_segments(const config::WeightEncoding& weights, int k,
                                            const std::vector<int>& widths,
                                            const std::vector<std::uint16_t>& bias_bits, std::uint64_t seed,
                                            GemmParams& params);

// A layer case on the device: weights, input, an unwritten output, the case's KV pools, the batch and
// a workspace, with ExecuteArgs over all of them. Synchronizes the context once the uploads are done.
struct DeviceCase {
  check::DeviceWeights weights;
  driver::DeviceBuffer input, output, keys, values, workspace;
  check::DeviceBatch batch;
  plan::ExecuteArgs args;

  DeviceCase(const plan::PrefillPlan& plan, const check::LayerCase& layer);
};

}  // namespace attnplan::gpu_testing
