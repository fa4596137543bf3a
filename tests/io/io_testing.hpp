// Helpers shared by the io tests: deterministic bytes, hand-made (possibly corrupt) safetensors files,
// and the Error a failed open() throws.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/files.hpp"
#include "io/safetensors.hpp"
#include "support/expect_error.hpp"

namespace attnplan::io::testing {

// n bytes that differ from tensor to tensor (seed) and from position to position.
inline std::vector<std::uint8_t> pattern_bytes(std::size_t n, unsigned seed) {
  std::vector<std::uint8_t> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::uint8_t>((i * 37 + seed * 101 + 11) % 251);
  return bytes;
}

// The 8-byte little-endian length, spelled out byte by byte (not through the code under test).
inline std::vector<std::uint8_t> le64(std::uint64_t value) {
  std::vector<std::uint8_t> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
  return bytes;
}

// A file laid out as the format says, from a header text and a data section, with the length field
// overridable so a test can lie about it.
inline void write_raw(const std::filesystem::path& path, std::string_view header,
                      const std::vector<std::uint8_t>& data, std::uint64_t length_field) {
  std::vector<std::uint8_t> file = le64(length_field);
  file.insert(file.end(), header.begin(), header.end());
  file.insert(file.end(), data.begin(), data.end());
  core::write_file_atomic(path, file.data(), file.size());
}
inline void write_raw(const std::filesystem::path& path, std::string_view header,
                      const std::vector<std::uint8_t>& data) {
  write_raw(path, header, data, header.size());
}

inline Error open_error(const std::filesystem::path& path) {
  return expect_error([&] { SafetensorsFile::open(path); });
}

}  // namespace attnplan::io::testing
