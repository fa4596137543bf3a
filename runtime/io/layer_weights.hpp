// One attention layer's weights, read from a safetensors checkpoint by their Hugging Face names and
// checked against the config (attention spec: weights as HF stores them, a projection weight is [out, in]).
//
// Under `prefix` ("model.layers.7." or "" for a file holding one layer) the loader reads:
//   input_layernorm.weight              [hidden]
//   self_attn.q_proj.weight             [Hq * D, hidden]     \  or, with projection.fused_qkv,
//   self_attn.k_proj.weight             [Hkv * D, hidden]     > self_attn.qkv_proj.weight
//   self_attn.v_proj.weight             [Hkv * Dv, hidden]   /  [Hq * D + Hkv * D + Hkv * Dv, hidden]
//   self_attn.{q,k,v}_proj.bias         [Hq * D], [Hkv * D], [Hkv * Dv]    when qkv_bias (fused: a
//                                       self_attn.qkv_proj.bias [Hq * D + Hkv * D + Hkv * Dv] if present)
//   self_attn.{q,k}_norm.weight         [D]                  when qkv_norm.query / qkv_norm.key
//   self_attn.o_proj.weight             [hidden, Hq * Dv]
//   self_attn.o_proj.bias               [hidden]             when output_bias
//   self_attn.sinks                     [Hq]                 when sinks
//   self_attn.k_scale, v_scale, ...     [] or [1]            kv_cache.dtype fp8_e4m3 (io/kv_cache_scales.hpp)
// Projection weights are read in the format of config.projection.qkv / .output by the checkpoint names of
// io/projection_format.hpp (bf16: the `weight` above; quantized: qweight, weight_scale, ... beside it). A
// fused qkv_proj is bf16 only. Norm weights, biases and sinks may be BF16, F16 or F32 and keep their dtype
// (to_doubles / to_bf16_bits convert them).
//
// Every other tensor named prefix + "self_attn." or prefix + "input_layernorm." is an error: a weight the
// file has but the config would ignore (a q_norm without qkv_norm.query) means the config and the
// checkpoint disagree. Exception: self_attn.rotary_emb.* (inv_freq buffers that old conversions saved;
// derived from the config, never weights). Tensors of the rest of the layer (mlp.*,
// post_attention_layernorm.*) and of other layers are not the attention's business and are ignored. The
// KV cache and attention scale names of io/kv_cache_scales.hpp are accepted with any cache dtype (a bf16
// cache leaves them unused).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "config/attention_config.hpp"
#include "io/dtype.hpp"
#include "io/kv_cache_scales.hpp"
#include "io/safetensors.hpp"

namespace attnplan::io {

// A tensor copied out of a file (or built in memory): raw little-endian elements, row-major.
struct HostTensor {
  Dtype dtype = Dtype::bf16;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;  // product(shape) * element_size(dtype)

  std::uint64_t element_count() const noexcept;
  friend bool operator==(const HostTensor&, const HostTensor&) = default;
};

// A BF16 tensor from raw bf16 bit patterns (core/bf16.hpp). Throws Error(input) when the count of
// `bits` does not match the shape.
HostTensor bf16_tensor(std::vector<std::int64_t> shape, std::span<const std::uint16_t> bits);

// A copy of one tensor of the file; Error(input) when it is absent.
HostTensor read_tensor(const SafetensorsFile& file, std::string_view name);

// The values of a BF16, F16, F32 or F64 tensor. Error(input) for any other dtype or when the byte count
// does not match the shape.
std::vector<double> to_doubles(const HostTensor& tensor);
// The values as bf16 bit patterns: BF16 copied as is, the others rounded once (to nearest, ties to even).
// Same dtypes and errors as to_doubles.
std::vector<std::uint16_t> to_bf16_bits(const HostTensor& tensor);

// The tensors beside a quantized projection's packed weight, by role (io/projection_format.hpp); all empty
// for bf16. Each keeps the checkpoint's dtype, shape and bytes.
struct QuantizationTensors {
  std::optional<HostTensor> scales;   // weight_scale / weight_scale_inv / _scales / scales
  std::optional<HostTensor> scale_2;  // nvfp4 weight_scale_2 (per tensor)
  std::optional<HostTensor> zeros;    // GPTQ/AWQ qzeros, MLX biases
  std::optional<HostTensor> g_idx;    // GPTQ act order (K group indices)
  friend bool operator==(const QuantizationTensors&, const QuantizationTensors&) = default;
};

struct HostLayerWeights {
  HostTensor input_norm;  // [hidden]
  // bf16: [Hq * D, hidden], [Hkv * D, hidden], [Hkv * Dv, hidden]. Quantized: the packed weight role as
  // stored (GPTQ qweight [K / 8, N], ...), its scales/zeros in q_quant... (io/projection_format.hpp).
  HostTensor q_proj, k_proj, v_proj;
  std::optional<HostTensor> q_bias, k_bias, v_bias;  // [Hq * D], [Hkv * D], [Hkv * Dv]
  std::optional<HostTensor> q_norm, k_norm;          // [D]
  HostTensor o_proj;                                 // [hidden, Hq * Dv]
  std::optional<HostTensor> o_bias;                  // [hidden]
  std::optional<HostTensor> sinks;                   // [Hq]
  QuantizationTensors q_quant, k_quant, v_quant, o_quant;
  // fp8_e4m3 cache: the scales to pass in plan::KvCacheView (the checkpoint's, else the config's); nullopt
  // for a bf16 cache and for weights not read from a checkpoint.
  std::optional<KvCacheScales> kv_scales;
  friend bool operator==(const HostLayerWeights&, const HostLayerWeights&) = default;
};

// Reads and checks one layer (see the top of this file); a fused qkv_proj (and its bias) is split by rows
// into q, k and v. `config` is a parsed, valid config. Every problem — a missing tensor, a wrong dtype or
// shape, an unused tensor under the prefix — is collected into one Error(input) whose details() has one
// line per problem, naming the tensor, what was expected and what was found; a missing tensor's line says
// under which prefixes the file has it, or which names are close, so a wrong prefix is easy to spot.
// With an fp8_e4m3 cache the KV cache scales are read too (read_kv_cache_scales: their problems join the
// same Error) into `kv_scales`.
// A quantized format with projection.fused_qkv is Error(input) at once.
HostLayerWeights load_layer_weights(const SafetensorsFile& file, const config::AttentionConfig& config,
                                    const std::string& prefix);

// Adds the layer to `writer` under `prefix` by the names load_layer_weights reads. With `fused_qkv`, q/k/v
// (and their biases, which must then be all present or all absent) are concatenated by rows into
// qkv_proj. Throws Error(input) for tensors that cannot be fused (dtypes or column counts differ) and
// whatever SafetensorsWriter::add throws.
void save_layer_weights(SafetensorsWriter& writer, const HostLayerWeights& weights, const std::string& prefix,
                        bool fused_qkv);
// The same for any projection formats: quantized projections are written by the names load_layer_weights
// reads for `projection.qkv` / `.output` (mxfp4 by the standard weight / weight_scale names). Quantized
// projections cannot be fused (Error(input)).
void save_layer_weights(SafetensorsWriter& writer, const HostLayerWeights& weights, const std::string& prefix,
                        const config::Projection& projection);

}  // namespace attnplan::io
