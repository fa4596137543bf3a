#include "io/projection_format.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace attnplan::io {
namespace {

using config::Fp8ScaleGranularity;
using config::PackedIntegerScheme;
using config::WeightFormat;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

void require_multiple(const std::string& base, std::string_view what, std::int64_t value, std::int64_t of,
                      const config::WeightEncoding& encoding) {
  if (value % of != 0) {
    throw Error(Stage::input, fmt::format("{}: {} {} is not a multiple of {}, which {} packing needs", base,
                                          what, value, of, config::to_string(encoding.format)));
  }
}

}  // namespace

int values_per_word(const config::WeightEncoding& encoding) {
  return 32 / encoding.bits;
}

std::int64_t group_count(const config::WeightEncoding& encoding, std::int64_t k) {
  return encoding.group_size > 0 ? k / encoding.group_size : 1;
}

std::int64_t scale_group_k(const config::WeightEncoding& encoding, std::int64_t k) {
  switch (encoding.format) {
    case WeightFormat::bf16:
      return k;
    case WeightFormat::fp8:
      return encoding.scale_granularity == Fp8ScaleGranularity::block ? 128 : k;
    case WeightFormat::mxfp8:
    case WeightFormat::mxfp4:
      return 32;
    case WeightFormat::nvfp4:
      return 16;
    case WeightFormat::packed_integer:
    case WeightFormat::affine:
      return encoding.group_size > 0 ? encoding.group_size : k;
  }
  return k;
}

std::vector<ProjectionTensorRule> projection_tensor_rules(const config::WeightEncoding& encoding,
                                                          const std::string& base, std::int64_t n,
                                                          std::int64_t k, bool gpt_oss_names) {
  const std::string dot = base + ".";
  const std::vector<Dtype> small_float = {Dtype::f16, Dtype::bf16, Dtype::f32};
  std::vector<ProjectionTensorRule> rules;
  const auto add = [&](TensorRole role, std::string relative, std::vector<Dtype> dtypes,
                       std::vector<std::vector<std::int64_t>> shapes, std::string formula) {
    rules.push_back(
        {role, std::move(relative), std::move(dtypes), std::move(shapes), std::move(formula), false});
  };
  switch (encoding.format) {
    case WeightFormat::bf16:
      add(TensorRole::weight, dot + "weight", {Dtype::bf16}, {{n, k}}, "[N, K]");
      break;
    case WeightFormat::fp8:
      add(TensorRole::weight, dot + "weight", {Dtype::f8_e4m3}, {{n, k}}, "[N, K]");
      switch (encoding.scale_granularity) {
        case Fp8ScaleGranularity::tensor:
          add(TensorRole::scales, dot + "weight_scale", {Dtype::f32}, {{}, {1}}, "[] (one scale per tensor)");
          break;
        case Fp8ScaleGranularity::channel:
          add(TensorRole::scales, dot + "weight_scale", {Dtype::f32}, {{n}, {n, 1}},
              "[N] (one scale per row)");
          break;
        case Fp8ScaleGranularity::block:
          add(TensorRole::scales, dot + "weight_scale_inv", {Dtype::f32, Dtype::bf16},
              {{ceil_div(n, 128), ceil_div(k, 128)}}, "[ceil(N / 128), ceil(K / 128)]");
          break;
      }
      break;
    case WeightFormat::mxfp8:
      require_multiple(base, "K", k, 32, encoding);
      add(TensorRole::weight, dot + "weight", {Dtype::f8_e4m3}, {{n, k}}, "[N, K]");
      add(TensorRole::scales, dot + "weight_scale", {Dtype::u8}, {{n, k / 32}}, "[N, K / 32] (E8M0)");
      break;
    case WeightFormat::mxfp4:
      require_multiple(base, "K", k, 32, encoding);
      if (gpt_oss_names) {
        add(TensorRole::weight, base + "_blocks", {Dtype::u8}, {{n, k / 32, 16}}, "[N, K / 32, 16]");
        add(TensorRole::scales, base + "_scales", {Dtype::u8}, {{n, k / 32}}, "[N, K / 32] (E8M0)");
      } else {
        add(TensorRole::weight, dot + "weight", {Dtype::u8}, {{n, k / 2}}, "[N, K / 2]");
        add(TensorRole::scales, dot + "weight_scale", {Dtype::u8}, {{n, k / 32}}, "[N, K / 32] (E8M0)");
      }
      break;
    case WeightFormat::nvfp4:
      require_multiple(base, "K", k, 16, encoding);
      add(TensorRole::weight, dot + "weight", {Dtype::u8}, {{n, k / 2}}, "[N, K / 2]");
      add(TensorRole::scales, dot + "weight_scale", {Dtype::f8_e4m3}, {{n, k / 16}}, "[N, K / 16]");
      add(TensorRole::scale_2, dot + "weight_scale_2", {Dtype::f32}, {{}, {1}}, "[] (one scale per tensor)");
      break;
    case WeightFormat::packed_integer: {
      const std::int64_t per_word = values_per_word(encoding);
      const std::int64_t groups = group_count(encoding, k);
      require_multiple(base, "N", n, per_word, encoding);
      if (encoding.scheme == PackedIntegerScheme::awq) {
        add(TensorRole::weight, dot + "qweight", {Dtype::i32}, {{k, n / per_word}}, "[K, N / 8]");
      } else {
        require_multiple(base, "K", k, per_word, encoding);
        add(TensorRole::weight, dot + "qweight", {Dtype::i32}, {{k / per_word, n}},
            fmt::format("[K / {}, N]", per_word));
      }
      add(TensorRole::zeros, dot + "qzeros", {Dtype::i32}, {{groups, n / per_word}},
          fmt::format("[K / group_size, N / {}]", per_word));
      add(TensorRole::scales, dot + "scales", small_float, {{groups, n}}, "[K / group_size, N]");
      if (encoding.scheme != PackedIntegerScheme::awq) {
        add(TensorRole::g_idx, dot + "g_idx", {Dtype::i32}, {{k}}, "[K]");
        rules.back().optional = !encoding.act_order;
      }
      break;
    }
    case WeightFormat::affine: {
      const std::int64_t groups = group_count(encoding, k);
      require_multiple(base, "K * bits", k * encoding.bits, 32, encoding);
      add(TensorRole::weight, dot + "weight", {Dtype::u32}, {{n, k * encoding.bits / 32}},
          "[N, K * bits / 32]");
      add(TensorRole::scales, dot + "scales", small_float, {{n, groups}}, "[N, K / group_size]");
      add(TensorRole::zeros, dot + "biases", small_float, {{n, groups}}, "[N, K / group_size]");
      break;
    }
  }
  return rules;
}

}  // namespace attnplan::io
