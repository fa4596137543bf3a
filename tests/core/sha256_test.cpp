// SHA-256 against the FIPS 180-4 example vectors, plus the properties the cache relies on:
// streaming in any chunking gives the one-shot digest, and update_field keeps field boundaries.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/sha256.hpp"
#include "support/catch.hpp"

using attnplan::core::Sha256;
using attnplan::core::sha256_hex;

namespace {

// Bytes 0..n-1 wrapping at 251 (a prime), so that no block repeats the previous one.
std::string pattern(std::size_t size) {
  std::string text(size, '\0');
  for (std::size_t i = 0; i < size; ++i) text[i] = static_cast<char>(i % 251);
  return text;
}

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-4 and NIST example vectors", "[core][sha256]") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 448 bits: the padding no longer fits the block, so a second block is needed.
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(
            "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
            "mnopqrstnopqrstu") == "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST_CASE("sha256 of one million 'a' (long message, fed in pieces)", "[core][sha256]") {
  const std::string expected = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  CHECK(sha256_hex(std::string(1000000, 'a')) == expected);
  Sha256 streamed;
  const std::string thousand(1000, 'a');
  for (int i = 0; i < 1000; ++i) streamed.update(thousand);
  CHECK(streamed.hex_digest() == expected);
}

TEST_CASE("sha256 around the padding boundaries", "[core][sha256]") {
  // 55 bytes is the longest message whose padding and length fit in one block; 56 needs two; 64 is a full
  // block.
  CHECK(sha256_hex(std::string(55, 'a')) ==
        "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  CHECK(sha256_hex(std::string(56, 'a')) ==
        "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  CHECK(sha256_hex(std::string(64, 'a')) ==
        "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST_CASE("sha256 gives the same digest however the input is split across updates", "[core][sha256]") {
  const std::string message = pattern(300);
  const std::string one_shot = sha256_hex(message);

  for (std::size_t split = 0; split <= message.size(); ++split) {
    Sha256 hash;
    hash.update(message.data(), split);
    hash.update(message.data() + split, message.size() - split);
    INFO("split at " << split);
    REQUIRE(hash.hex_digest() == one_shot);
  }
  for (std::size_t chunk : {1u, 3u, 63u, 64u, 65u, 128u, 299u}) {
    Sha256 hash;
    for (std::size_t offset = 0; offset < message.size(); offset += chunk) {
      hash.update(message.substr(offset, chunk));
    }
    INFO("chunks of " << chunk);
    CHECK(hash.hex_digest() == one_shot);
  }
  // Empty updates change nothing.
  Sha256 with_empty;
  with_empty.update("").update(message).update(nullptr, 0);
  CHECK(with_empty.hex_digest() == one_shot);
}

TEST_CASE("sha256 digest bytes and hex agree; hex is 64 lowercase digits", "[core][sha256]") {
  const std::array<std::uint8_t, 32> bytes = Sha256().update("abc").digest();
  CHECK(bytes[0] == 0xba);
  CHECK(bytes[31] == 0xad);
  const std::string hex = sha256_hex(pattern(1000));
  CHECK(hex.size() == 64);
  CHECK(hex.find_first_not_of("0123456789abcdef") == std::string::npos);
  const std::vector<std::uint8_t> raw = {0x61, 0x62, 0x63};
  CHECK(sha256_hex(raw.data(), raw.size()) == sha256_hex("abc"));
}

TEST_CASE("sha256 update_field keeps field boundaries apart", "[core][sha256]") {
  const std::string ab_c = Sha256().update_field("ab").update_field("c").hex_digest();
  const std::string a_bc = Sha256().update_field("a").update_field("bc").hex_digest();
  const std::string abc_empty = Sha256().update_field("abc").update_field("").hex_digest();
  CHECK(ab_c != a_bc);
  CHECK(ab_c != abc_empty);
  CHECK(a_bc != abc_empty);
  // Plain updates do not: that is why fields are length-prefixed.
  CHECK(Sha256().update("ab").update("c").hex_digest() == Sha256().update("a").update("bc").hex_digest());
  // Deterministic.
  CHECK(ab_c == Sha256().update_field("ab").update_field("c").hex_digest());
}
