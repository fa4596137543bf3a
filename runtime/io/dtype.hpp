// The element types a safetensors file can hold that attnplan reads, spelled as the format spells them
// ("BF16", "F8_E4M3", ...). Element bytes are little-endian, as the format prescribes.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace attnplan::io {

enum class Dtype { bf16, f16, f32, f64, f8_e4m3, f8_e5m2, u8, i8, i16, i32, u32, i64, bool_ };

// The format's name: "BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2", "U8", "I8", "I16", "I32", "U32",
// "I64", "BOOL".
std::string_view to_string(Dtype dtype);

// The inverse of to_string; nullopt for a name attnplan does not read (the format has more, e.g. "U16").
std::optional<Dtype> dtype_from_name(std::string_view name);

// "BF16, F16, ..., BOOL", for messages that list what is accepted.
std::string dtype_name_list();

// Bytes per element: 1 for the 8-bit types and BOOL (one byte per value, 0 or 1).
std::size_t element_size(Dtype dtype);

}  // namespace attnplan::io
