// Reference dequantization, bit for bit on hand-packed values: E8M0 (incl. 0xFF NaN), the E2M1 table,
// e4m3fn (NaN, subnormals, max), fp8 tensor/channel/block scales, nvfp4 two-level scales, GPTQ v1 (+1) vs
// v2 zero points, act-order g_idx, 8-bit packed integers, AWQ nibble order, per-channel groups, and MLX
// affine words of 2..8 bits (3/5/6 crossing words) with negative scales.
#include "reference/dequantize.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/bf16.hpp"
#include "io/float16.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using config::WeightEncoding;
using config::WeightFormat;
using io::Dtype;
using io::HostTensor;

namespace {

template <class Element>
HostTensor tensor_of(Dtype dtype, std::vector<std::int64_t> shape, const std::vector<Element>& values) {
  HostTensor tensor{dtype, std::move(shape), std::vector<std::uint8_t>(values.size() * sizeof(Element))};
  std::memcpy(tensor.bytes.data(), values.data(), tensor.bytes.size());
  return tensor;
}

HostTensor f16_of(std::vector<std::int64_t> shape, const std::vector<float>& values) {
  std::vector<std::uint16_t> bits;
  for (float v : values) bits.push_back(io::float_to_f16_normal(v));
  return tensor_of(Dtype::f16, std::move(shape), bits);
}

WeightEncoding encoding_of(WeightFormat format) {
  WeightEncoding encoding;
  encoding.format = format;
  return encoding;
}

}  // namespace

TEST_CASE("scalar decoders match the OCP and float8 tables", "[reference][dequantize]") {
  CHECK(reference::e8m0_value(127) == 1.0);
  CHECK(reference::e8m0_value(0) == std::ldexp(1.0, -127));
  CHECK(reference::e8m0_value(254) == std::ldexp(1.0, 127));
  CHECK(std::isnan(reference::e8m0_value(0xFF)));

  const double table[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  for (std::uint8_t nibble = 0; nibble < 16; ++nibble) {
    const double expected = nibble < 8 ? table[nibble] : -table[nibble - 8];
    CHECK(reference::e2m1_value(nibble) == expected);
  }
  CHECK(reference::e2m1_value(0xF3) == 1.5);  // only the low nibble counts

  CHECK(reference::e4m3fn_value(0x38) == 1.0);    // 0.0111.000
  CHECK(reference::e4m3fn_value(0x7E) == 448.0);  // the largest finite
  CHECK(reference::e4m3fn_value(0xFE) == -448.0);
  CHECK(reference::e4m3fn_value(0x01) == std::ldexp(1.0, -9));  // smallest subnormal: 1/8 * 2^-6
  CHECK(reference::e4m3fn_value(0x07) == 7 * std::ldexp(1.0, -9));
  CHECK(reference::e4m3fn_value(0x08) == std::ldexp(1.0, -6));  // smallest normal
  CHECK(reference::e4m3fn_value(0x77) == 240.0);                // 0.1110.111: 1.875 * 2^7
  CHECK(std::isnan(reference::e4m3fn_value(0x7F)));
  CHECK(std::isnan(reference::e4m3fn_value(0xFF)));
  CHECK(reference::e4m3fn_value(0x80) == 0.0);
  CHECK(std::signbit(reference::e4m3fn_value(0x80)));
}

TEST_CASE("fp8 scales per tensor, channel and 128x128 block", "[reference][dequantize]") {
  // W [2, 130]: every byte 0x38 (1.0) except W[1][129] = 0xC0 (-2.0).
  std::vector<std::uint8_t> bytes(260, 0x38);
  bytes[259] = 0xC0;
  const HostTensor weight = tensor_of(Dtype::f8_e4m3, {2, 130}, bytes);
  WeightEncoding encoding = encoding_of(WeightFormat::fp8);

  io::QuantizationTensors quant;
  quant.scales = tensor_of(Dtype::f32, {}, std::vector<float>{0.25f});
  auto w = reference::dequantize(encoding, weight, quant, 2, 130);
  CHECK(w.data[0] == 0.25);
  CHECK(w.data[259] == -0.5);

  encoding.scale_granularity = config::Fp8ScaleGranularity::channel;
  quant.scales = tensor_of(Dtype::f32, {2, 1}, std::vector<float>{0.5f, 3.0f});
  w = reference::dequantize(encoding, weight, quant, 2, 130);
  CHECK(w.data[129] == 0.5);
  CHECK(w.data[130] == 3.0);

  encoding.scale_granularity = config::Fp8ScaleGranularity::block;  // [ceil(2/128), ceil(130/128)] = [1, 2]
  quant.scales = tensor_of(Dtype::bf16, {1, 2}, std::vector<std::uint16_t>{0x3F80, 0x4040});  // 1, 3
  w = reference::dequantize(encoding, weight, quant, 2, 130);
  CHECK(w.data[127] == 1.0);
  CHECK(w.data[128] == 3.0);
  CHECK(w.data[259] == -6.0);
}

TEST_CASE("MX formats: E8M0 per 32 values, E2M1 low nibble first, NaN scale", "[reference][dequantize]") {
  // mxfp4 W [1, 64]: byte j holds k = 2j (low) and 2j + 1 (high).
  std::vector<std::uint8_t> packed(32, 0);
  packed[0] = 0xB7;   // k0 = 6, k1 = -1.5
  packed[16] = 0x02;  // k32 = 1
  const HostTensor weight = tensor_of(Dtype::u8, {1, 32}, packed);
  io::QuantizationTensors quant;
  quant.scales = tensor_of(Dtype::u8, {1, 2}, std::vector<std::uint8_t>{126, 0xFF});  // 0.5, NaN
  const auto w = reference::dequantize(encoding_of(WeightFormat::mxfp4), weight, quant, 1, 64);
  CHECK(w.data[0] == 3.0);
  CHECK(w.data[1] == -0.75);
  CHECK(w.data[2] == 0.0);
  CHECK(std::isnan(w.data[32]));

  // mxfp8 W [1, 32]: e4m3 * 2^(e - 127).
  std::vector<std::uint8_t> fp8(32, 0x40);                                      // 2.0
  fp8[5] = 0x01;                                                                // 2^-9
  quant.scales = tensor_of(Dtype::u8, {1, 1}, std::vector<std::uint8_t>{130});  // 8
  const auto w8 = reference::dequantize(encoding_of(WeightFormat::mxfp8),
                                        tensor_of(Dtype::f8_e4m3, {1, 32}, fp8), quant, 1, 32);
  CHECK(w8.data[0] == 16.0);
  CHECK(w8.data[5] == std::ldexp(1.0, -6));
}

TEST_CASE("nvfp4: E2M1 times an e4m3 block scale times the tensor scale", "[reference][dequantize]") {
  std::vector<std::uint8_t> packed(16, 0);
  packed[0] = 0x5D;  // k0 = -3 (0xD), k1 = 3 (0x5)
  packed[8] = 0x07;  // k16 = 6
  io::QuantizationTensors quant;
  quant.scales = tensor_of(Dtype::u8, {1, 2}, std::vector<std::uint8_t>{0x30, 0x01});  // 0.5, 2^-9
  quant.scales->dtype = Dtype::f8_e4m3;
  quant.scale_2 = tensor_of(Dtype::f32, {}, std::vector<float>{0.125f});
  const auto w = reference::dequantize(encoding_of(WeightFormat::nvfp4),
                                       tensor_of(Dtype::u8, {1, 16}, packed), quant, 1, 32);
  CHECK(w.data[0] == -3.0 * 0.5 * 0.125);
  CHECK(w.data[1] == 3.0 * 0.5 * 0.125);
  CHECK(w.data[16] == 6.0 * std::ldexp(1.0, -9) * 0.125);
}

TEST_CASE("GPTQ: v1 adds one to the zero point, v2 does not; g_idx picks the group",
          "[reference][dequantize]") {
  // K 16, N 8, group 8: qweight [2, 8], word r of column n holds k = 8r + j at bits 4j.
  std::vector<std::uint32_t> qweight(16, 0);
  qweight[3] = 0x000000F5;                                       // column 3: k0 = 5, k1 = 15
  qweight[8 + 3] = 0x9u << 28;                                   // column 3: k15 = 9
  std::vector<std::uint32_t> qzeros = {0x00007000, 0x00002000};  // column 3: z = 7 (group 0), 2 (group 1)
  io::QuantizationTensors quant;
  quant.zeros = tensor_of(Dtype::i32, {2, 1}, qzeros);
  std::vector<float> scales(16, 1.0f);
  scales[3] = 0.5f;       // group 0, column 3
  scales[8 + 3] = -2.0f;  // group 1, column 3
  quant.scales = f16_of({2, 8}, scales);
  WeightEncoding encoding = encoding_of(WeightFormat::packed_integer);
  encoding.group_size = 8;
  const HostTensor weight = tensor_of(Dtype::i32, {2, 8}, qweight);

  auto w = reference::dequantize(encoding, weight, quant, 8, 16);  // gptq: q - (z + 1)
  CHECK(w.data[3 * 16 + 0] == 0.5 * (5 - 8));
  CHECK(w.data[3 * 16 + 1] == 0.5 * (15 - 8));
  CHECK(w.data[3 * 16 + 15] == -2.0 * (9 - 3));
  encoding.scheme = config::PackedIntegerScheme::gptq_v2;  // q - z
  w = reference::dequantize(encoding, weight, quant, 8, 16);
  CHECK(w.data[3 * 16 + 0] == 0.5 * (5 - 7));
  CHECK(w.data[3 * 16 + 15] == -2.0 * (9 - 2));

  // Act order: k0 in group 1, k15 in group 0.
  std::vector<std::int32_t> g_idx(16, 0);
  g_idx[0] = 1;
  quant.g_idx = tensor_of(Dtype::i32, {16}, g_idx);
  w = reference::dequantize(encoding, weight, quant, 8, 16);
  CHECK(w.data[3 * 16 + 0] == -2.0 * (5 - 2));
  CHECK(w.data[3 * 16 + 15] == 0.5 * (9 - 7));
}

TEST_CASE("GPTQ 8-bit per channel packs four values per word", "[reference][dequantize]") {
  // K 8, N 4, group -1: qweight [2, 4], qzeros [1, 1], scales [1, 4].
  std::vector<std::uint32_t> qweight(8, 0);
  qweight[1] = 0xC8000000u;      // column 1: k3 = 200
  qweight[4 + 2] = 0x000000FFu;  // column 2: k4 = 255
  io::QuantizationTensors quant;
  quant.zeros =
      tensor_of(Dtype::i32, {1, 1}, std::vector<std::uint32_t>{0x807F0080u});  // z = 128, 0, 127, 128
  quant.scales = f16_of({1, 4}, {1.0f, 0.25f, 0.5f, 1.0f});
  WeightEncoding encoding = encoding_of(WeightFormat::packed_integer);
  encoding.bits = 8;
  encoding.group_size = -1;
  encoding.scheme = config::PackedIntegerScheme::gptq_v2;
  const auto w = reference::dequantize(encoding, tensor_of(Dtype::i32, {2, 4}, qweight), quant, 4, 8);
  CHECK(w.data[1 * 8 + 3] == 0.25 * 200);
  CHECK(w.data[2 * 8 + 4] == 0.5 * (255 - 127));
  CHECK(w.data[0] == -128.0);
}

TEST_CASE("AWQ: nibble i holds column 8c + [0,2,4,6,1,3,5,7][i]", "[reference][dequantize]") {
  // K 2, N 8, group 2: qweight [2, 1]; nibble i of row 0 = i, so column order[i] gets value i.
  const std::vector<std::uint32_t> qweight = {0x76543210u, 0u};
  io::QuantizationTensors quant;
  quant.zeros = tensor_of(Dtype::i32, {1, 1}, std::vector<std::uint32_t>{0x00000001u});  // column 0: z 1
  quant.scales = f16_of({1, 8}, std::vector<float>(8, 1.0f));
  WeightEncoding encoding = encoding_of(WeightFormat::packed_integer);
  encoding.scheme = config::PackedIntegerScheme::awq;
  encoding.group_size = 2;
  const auto w = reference::dequantize(encoding, tensor_of(Dtype::i32, {2, 1}, qweight), quant, 8, 2);
  const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(w.data[std::size_t(order[i]) * 2] == i - (order[i] == 0 ? 1 : 0));
  }
}

TEST_CASE("MLX affine: LSB-first stream, words crossed by 3/5/6 bits, negative scales",
          "[reference][dequantize]") {
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    CAPTURE(bits);
    // K 32 values 0, 1, 2, ... (mod 2^bits) packed by hand into a bit stream.
    const int k = 32;
    std::vector<std::uint8_t> stream(std::size_t(k * bits / 8), 0);
    for (int i = 0; i < k; ++i) {
      const std::uint32_t value = std::uint32_t(i) % (1u << bits);
      for (int b = 0; b < bits; ++b) {
        const int position = i * bits + b;
        stream[std::size_t(position / 8)] |= std::uint8_t(((value >> b) & 1u) << (position % 8));
      }
    }
    std::vector<std::uint32_t> words(stream.size() / 4);
    std::memcpy(words.data(), stream.data(), stream.size());
    io::QuantizationTensors quant;
    quant.scales = f16_of({1, 1}, {-0.5f});
    quant.zeros = f16_of({1, 1}, {3.0f});
    WeightEncoding encoding = encoding_of(WeightFormat::affine);
    encoding.bits = bits;
    encoding.group_size = 32;
    const auto w = reference::dequantize(
        encoding, tensor_of(Dtype::u32, {1, std::int64_t(words.size())}, words), quant, 1, k);
    for (int i = 0; i < k; ++i) {
      CAPTURE(i);
      CHECK(w.data[std::size_t(i)] == -0.5 * double(i % (1 << bits)) + 3.0);
    }
  }
  // 3 bits: value 10 (k = 10) sits at bits 30..32, across words 0 and 1.
  const std::vector<std::uint8_t> crossing = {0, 0, 0, 0xC0, 0x01, 0, 0, 0};  // bits 30, 31, 32 set
  CHECK(reference::stream_bits(crossing, 10, 3) == 7);
}
