// SHA-256 (FIPS 180-4), for cache keys and cubin integrity checks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attnplan::core {

class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, std::size_t size);
  Sha256& update(std::string_view text) { return update(text.data(), text.size()); }
  // Length-prefixed update: keeps ("ab","c") and ("a","bc") apart when fields are hashed in sequence.
  Sha256& update_field(std::string_view text);
  std::array<std::uint8_t, 32> digest();  // finalizes; the object must not be updated afterwards
  std::string hex_digest();

 private:
  void compress(const std::uint8_t* block);
  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
};

std::string sha256_hex(const void* data, std::size_t size);
inline std::string sha256_hex(std::string_view text) {
  return sha256_hex(text.data(), text.size());
}

}  // namespace attnplan::core
