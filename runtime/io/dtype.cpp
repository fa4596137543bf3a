#include "io/dtype.hpp"

#include <array>

#include "core/error.hpp"

namespace attnplan::io {
namespace {

struct DtypeEntry {
  Dtype dtype;
  std::string_view name;
  std::size_t size;
};

// One table for names and sizes, so the two cannot disagree; in enum order.
constexpr std::array kDtypes{
    DtypeEntry{Dtype::bf16, "BF16", 2},       DtypeEntry{Dtype::f16, "F16", 2},
    DtypeEntry{Dtype::f32, "F32", 4},         DtypeEntry{Dtype::f64, "F64", 8},
    DtypeEntry{Dtype::f8_e4m3, "F8_E4M3", 1}, DtypeEntry{Dtype::f8_e5m2, "F8_E5M2", 1},
    DtypeEntry{Dtype::u8, "U8", 1},           DtypeEntry{Dtype::i8, "I8", 1},
    DtypeEntry{Dtype::i16, "I16", 2},         DtypeEntry{Dtype::i32, "I32", 4},
    DtypeEntry{Dtype::u32, "U32", 4},         DtypeEntry{Dtype::i64, "I64", 8},
    DtypeEntry{Dtype::bool_, "BOOL", 1},
};

const DtypeEntry& entry_of(Dtype dtype) {
  for (const auto& entry : kDtypes) {
    if (entry.dtype == dtype) return entry;
  }
  throw Error(Stage::internal, "io::Dtype value outside the enum");
}

}  // namespace

std::string_view to_string(Dtype dtype) {
  return entry_of(dtype).name;
}

std::optional<Dtype> dtype_from_name(std::string_view name) {
  for (const auto& entry : kDtypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

std::string dtype_name_list() {
  std::string list;
  for (const auto& entry : kDtypes) {
    if (!list.empty()) list += ", ";
    list += entry.name;
  }
  return list;
}

std::size_t element_size(Dtype dtype) {
  return entry_of(dtype).size;
}

}  // namespace attnplan::io
