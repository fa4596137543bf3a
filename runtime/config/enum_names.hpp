// The JSON spelling of every config enum, one table per enum: to_string() and the parser read the
// same table, so a name cannot be printed in one form and expected in another.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "config/attention_config.hpp"

namespace attnplan::config::detail {

template <typename Enum>
struct EnumName {
  Enum value;
  std::string_view name;
};

template <typename Enum>
inline constexpr std::array<EnumName<Enum>, 0> kEnumNames{};

template <>
inline constexpr std::array kEnumNames<RopeScalingType>{
    EnumName<RopeScalingType>{RopeScalingType::none, "none"},
    EnumName<RopeScalingType>{RopeScalingType::linear, "linear"},
    EnumName<RopeScalingType>{RopeScalingType::llama3, "llama3"},
    EnumName<RopeScalingType>{RopeScalingType::yarn, "yarn"},
};

template <>
inline constexpr std::array kEnumNames<WeightFormat>{
    EnumName<WeightFormat>{WeightFormat::bf16, "bf16"},
    EnumName<WeightFormat>{WeightFormat::fp8, "fp8"},
    EnumName<WeightFormat>{WeightFormat::mxfp8, "mxfp8"},
    EnumName<WeightFormat>{WeightFormat::mxfp4, "mxfp4"},
    EnumName<WeightFormat>{WeightFormat::nvfp4, "nvfp4"},
    EnumName<WeightFormat>{WeightFormat::packed_integer, "packed_integer"},
    EnumName<WeightFormat>{WeightFormat::affine, "affine"},
};

template <>
inline constexpr std::array kEnumNames<Fp8ScaleGranularity>{
    EnumName<Fp8ScaleGranularity>{Fp8ScaleGranularity::tensor, "tensor"},
    EnumName<Fp8ScaleGranularity>{Fp8ScaleGranularity::channel, "channel"},
    EnumName<Fp8ScaleGranularity>{Fp8ScaleGranularity::block, "block"},
};

template <>
inline constexpr std::array kEnumNames<ActivationType>{
    EnumName<ActivationType>{ActivationType::bf16, "bf16"},
    EnumName<ActivationType>{ActivationType::fp8, "fp8"},
};

template <>
inline constexpr std::array kEnumNames<PackedIntegerScheme>{
    EnumName<PackedIntegerScheme>{PackedIntegerScheme::gptq, "gptq"},
    EnumName<PackedIntegerScheme>{PackedIntegerScheme::gptq_v2, "gptq_v2"},
    EnumName<PackedIntegerScheme>{PackedIntegerScheme::awq, "awq"},
};

template <>
inline constexpr std::array kEnumNames<Fp8ActivationScales>{
    EnumName<Fp8ActivationScales>{Fp8ActivationScales::token, "token"},
    EnumName<Fp8ActivationScales>{Fp8ActivationScales::token_group, "token_group"},
};

template <>
inline constexpr std::array kEnumNames<KvCacheDtype>{
    EnumName<KvCacheDtype>{KvCacheDtype::bf16, "bf16"},
    EnumName<KvCacheDtype>{KvCacheDtype::fp8_e4m3, "fp8_e4m3"},
};

template <typename Enum>
constexpr std::string_view enum_name(Enum value) {
  static_assert(!kEnumNames<Enum>.empty(), "no name table for this enum");
  for (const auto& entry : kEnumNames<Enum>) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

template <typename Enum>
constexpr std::optional<Enum> enum_from_name(std::string_view name) {
  static_assert(!kEnumNames<Enum>.empty(), "no name table for this enum");
  for (const auto& entry : kEnumNames<Enum>) {
    if (entry.name == name) return entry.value;
  }
  return std::nullopt;
}

// "bf16, fp8, mxfp8" for messages that list the accepted values.
template <typename Enum>
std::string enum_name_list() {
  std::string list;
  for (const auto& entry : kEnumNames<Enum>) {
    if (!list.empty()) list += ", ";
    list += entry.name;
  }
  return list;
}

}  // namespace attnplan::config::detail
