// Hand-made broken files: each corruption is an Error(input) that names the file, the tensor and the
// problem, found before anything is allocated from the header's claims. And what the reader deliberately
// tolerates: gaps, trailing bytes, zero-size tensors anywhere.
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/files.hpp"
#include "io/safetensors.hpp"
#include "io_testing.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"

using attnplan::Error;
using attnplan::Stage;
using attnplan::io::SafetensorsFile;
using attnplan::io::testing::le64;
using attnplan::io::testing::open_error;
using attnplan::io::testing::pattern_bytes;
using attnplan::io::testing::write_raw;
using attnplan::testing::TempDir;

namespace {

// The Error of opening a file made of `header` and `data`, checked to be an input error naming the file.
Error corrupt(const TempDir& dir, std::string_view header, const std::vector<std::uint8_t>& data) {
  const auto path = dir / "corrupt.safetensors";
  write_raw(path, header, data);
  Error error = open_error(path);
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), path.string()));
  return error;
}

// One tensor entry {"t": {...}} around the given fields.
std::string one_tensor(const std::string& fields) {
  return R"({"t":{)" + fields + "}}";
}

}  // namespace

TEST_CASE("a file shorter than the 8-byte length is refused", "[io][safetensors][corrupt]") {
  TempDir dir;
  for (const std::size_t size : {0, 1, 7}) {
    CAPTURE(size);
    const std::vector<std::uint8_t> bytes(size, 0x20);
    attnplan::core::write_file_atomic(dir / "short", bytes.data(), bytes.size());
    const auto error = open_error(dir / "short");
    CHECK(error.stage() == Stage::input);
    CHECK(contains(error.message(), (dir / "short").string()));
    CHECK(contains(error.message(), std::to_string(size) + " bytes is too short"));
  }
}

TEST_CASE("an absurd header length or one beyond the file is refused", "[io][safetensors][corrupt]") {
  TempDir dir;
  const std::string header = one_tensor(R"("dtype":"U8","shape":[1],"data_offsets":[0,1])");

  write_raw(dir / "huge", header, {1}, std::uint64_t{1} << 40);
  auto error = open_error(dir / "huge");
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), "header length 1099511627776 bytes is absurd"));

  write_raw(dir / "limit", header, {1}, attnplan::io::kMaxHeaderBytes + 1);
  CHECK(contains(open_error(dir / "limit").message(), "is absurd (more than 100 MiB)"));

  // Within the limit but past the end: a truncated file.
  write_raw(dir / "truncated", header, {1}, header.size() + 2);
  error = open_error(dir / "truncated");
  CHECK(contains(error.message(), "goes beyond the end of the file"));
  CHECK(contains(error.message(), (dir / "truncated").string()));

  // A whole valid file cut short inside its data is caught by the offsets instead.
  write_raw(dir / "cut", one_tensor(R"("dtype":"F32","shape":[4],"data_offsets":[0,16])"),
            pattern_bytes(10, 0));
  CHECK(contains(open_error(dir / "cut").message(), "end beyond the data section (10 bytes)"));
}

TEST_CASE("a header that is not a JSON object is refused", "[io][safetensors][corrupt]") {
  TempDir dir;
  auto error = corrupt(dir, R"({"t":{"dtype":"U8",)", {});
  CHECK(contains(error.message(), "the header is not valid JSON"));
  CHECK(contains(error.message(), "parse error"));
  CHECK_FALSE(contains(error.message(), "json.exception"));

  CHECK(contains(corrupt(dir, "", {}).message(), "not valid JSON"));
  CHECK(contains(corrupt(dir, "\xff\xfe garbage", {}).message(), "not valid JSON"));
  CHECK(contains(corrupt(dir, "[1, 2]", {}).message(), "the header is a JSON array, not an object"));
  CHECK(contains(corrupt(dir, "42      ", {}).message(), "a JSON number, not an object"));
}

TEST_CASE("a header nested far deeper than the format's is refused while parsing",
          "[io][safetensors][corrupt]") {
  TempDir dir;
  const std::string deep = R"({"t":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  CHECK(contains(corrupt(dir, deep, {}).message(), "the header nests deeper than 16 levels"));
}

TEST_CASE("unknown dtypes and malformed entries are refused, naming the tensor",
          "[io][safetensors][corrupt]") {
  TempDir dir;
  auto error = corrupt(dir, one_tensor(R"("dtype":"U16","shape":[1],"data_offsets":[0,2])"), {0, 0});
  CHECK(contains(error.message(), "tensor \"t\": unknown dtype \"U16\" (attnplan reads BF16, F16"));

  CHECK(contains(corrupt(dir, one_tensor(R"("dtype":3,"shape":[1],"data_offsets":[0,1])"), {0}).message(),
                 "tensor \"t\": dtype 3 is not a string"));
  CHECK(contains(corrupt(dir, one_tensor(R"("shape":[1],"data_offsets":[0,1])"), {0}).message(),
                 "tensor \"t\": no \"dtype\""));
  CHECK(contains(corrupt(dir, R"({"t":[1,2]})", {}).message(),
                 "tensor \"t\": entry is array ([1,2]), expected an object"));
  CHECK(contains(
      corrupt(dir, one_tensor(R"("dtype":"U8","shape":[1],"data_offsets":[0,1],"offset":0)"), {0}).message(),
      "tensor \"t\": unknown key \"offset\""));
}

TEST_CASE("shapes must be arrays of non-negative integers", "[io][safetensors][corrupt]") {
  TempDir dir;
  CHECK(
      contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":[2,-1],"data_offsets":[0,0])"), {}).message(),
               "tensor \"t\": shape[1] is -1, expected a non-negative integer"));
  CHECK(contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":[2.5],"data_offsets":[0,0])"), {}).message(),
                 "shape[0] is 2.5"));
  CHECK(contains(
      corrupt(dir, one_tensor(R"("dtype":"U8","shape":[2.0],"data_offsets":[0,2])"), {0, 0}).message(),
      "shape[0] is 2.0"));
  CHECK(contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":["3"],"data_offsets":[0,3])"), {}).message(),
                 "shape[0] is \"3\""));
  CHECK(contains(
      corrupt(dir, one_tensor(R"("dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0])"), {})
          .message(),
      "shape[0] is 9223372036854775808"));
  CHECK(contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":3,"data_offsets":[0,3])"), {}).message(),
                 "shape 3 is not an array"));
  CHECK(contains(corrupt(dir, one_tensor(R"("dtype":"U8","data_offsets":[0,3])"), {}).message(),
                 "no \"shape\""));
}

TEST_CASE("data_offsets must be [begin, end] within the data section", "[io][safetensors][corrupt]") {
  TempDir dir;
  const std::vector<std::uint8_t> data = pattern_bytes(8, 0);
  CHECK(contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":[1],"data_offsets":[0])"), data).message(),
                 "tensor \"t\": data_offsets [0] is not [begin, end] of two non-negative integers"));
  CHECK(
      contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":[1],"data_offsets":[0,1,2])"), data).message(),
               "data_offsets [0,1,2] is not [begin, end]"));
  CHECK(
      contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":[1],"data_offsets":[-1,0])"), data).message(),
               "data_offsets [-1,0] is not [begin, end]"));
  CHECK(
      contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":[1],"data_offsets":{"a":1})"), data).message(),
               "data_offsets {\"a\":1} is not [begin, end]"));
  CHECK(contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":[1])"), data).message(),
                 "no \"data_offsets\""));
  CHECK(contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":[0],"data_offsets":[5,3])"), data).message(),
                 "tensor \"t\": data_offsets [5, 3] has begin after end"));
  CHECK(
      contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":[4],"data_offsets":[6,10])"), data).message(),
               "tensor \"t\": data_offsets [6, 10] end beyond the data section (8 bytes)"));
  CHECK(contains(corrupt(dir, one_tensor(R"("dtype":"U8","shape":[0],"data_offsets":[9,9])"), data).message(),
                 "end beyond the data section"));
}

TEST_CASE("a byte range that disagrees with shape and dtype is refused", "[io][safetensors][corrupt]") {
  TempDir dir;
  const auto error =
      corrupt(dir, one_tensor(R"("dtype":"F32","shape":[2,2],"data_offsets":[0,12])"), pattern_bytes(16, 0));
  CHECK(contains(error.message(),
                 "tensor \"t\": data_offsets [0, 12] hold 12 bytes but shape [2, 2] of F32 needs 16"));
  CHECK(contains(
      corrupt(dir, one_tensor(R"("dtype":"BF16","shape":[],"data_offsets":[0,4])"), pattern_bytes(4, 0))
          .message(),
      "hold 4 bytes but shape [] of BF16 needs 2"));
}

TEST_CASE("a header claiming a terabyte tensor is an error, never an allocation",
          "[io][safetensors][corrupt]") {
  TempDir dir;
  const std::vector<std::uint8_t> data = pattern_bytes(8, 0);
  // 2^18 * 2^20 F32 = 2^40 bytes, with matching offsets: the data section is what gives it away.
  auto error = corrupt(
      dir, one_tensor(R"("dtype":"F32","shape":[262144,1048576],"data_offsets":[0,1099511627776])"), data);
  CHECK(contains(error.message(), "data_offsets [0, 1099511627776] end beyond the data section (8 bytes)"));

  // The same claim over the 8 bytes the file has.
  error = corrupt(dir, one_tensor(R"("dtype":"F32","shape":[262144,1048576],"data_offsets":[0,8])"), data);
  CHECK(contains(error.message(), "hold 8 bytes but shape [262144, 1048576] of F32 needs 1099511627776"));

  // Extents whose product does not fit 64 bits must not wrap around to a small, "matching" size:
  // 2^32 * 2^32 * 2 bytes wraps to 0.
  error = corrupt(dir, one_tensor(R"("dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,0])"),
                  data);
  CHECK(contains(error.message(), "shape [4294967296, 4294967296] of BF16 overflows 64-bit byte counts"));
  // Element count fits, bytes do not: 2^62 elements * 8 bytes.
  error =
      corrupt(dir, one_tensor(R"("dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,0])"), data);
  CHECK(contains(error.message(), "overflows"));
}

TEST_CASE("tensors sharing bytes are refused; gaps and zero-size tensors are not",
          "[io][safetensors][corrupt]") {
  TempDir dir;
  const std::vector<std::uint8_t> data = pattern_bytes(24, 0);
  auto error = corrupt(dir,
                       R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                       data);
  CHECK(contains(error.message(), "tensors \"a\" [0, 8) and \"b\" [4, 12) overlap"));

  // One tensor inside another, with a third between: compared with the furthest-reaching range, not the last.
  error = corrupt(dir,
                  R"({"big":{"dtype":"U8","shape":[20],"data_offsets":[0,20]},)"
                  R"("x":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
                  R"("y":{"dtype":"U8","shape":[2],"data_offsets":[10,12]}})",
                  data);
  CHECK(error.details().size() == 2);
  CHECK(contains(error.message(), "\"big\" [0, 20) and \"x\" [2, 4) overlap"));
  CHECK(contains(error.details().at(1), "\"big\" [0, 20) and \"y\" [10, 12) overlap"));

  // Identical ranges overlap too.
  CHECK(contains(corrupt(dir,
                         R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                         data)
                     .message(),
                 "overlap"));

  // Lenient: a gap, trailing bytes, and zero-size tensors at any offset (even inside another tensor).
  write_raw(dir / "lenient",
            R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]},)"
            R"("e1":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
            R"("e2":{"dtype":"F32","shape":[0,3],"data_offsets":[2,2]}})",
            data);
  const SafetensorsFile file = SafetensorsFile::open(dir / "lenient");
  CHECK(file.names() == std::vector<std::string>{"a", "e1", "e2", "b"});
  CHECK(file.bytes("b")[0] == data[8]);
  CHECK(file.bytes("e2").empty());
}

TEST_CASE("duplicate names and non-string metadata are refused", "[io][safetensors][corrupt]") {
  TempDir dir;
  auto error = corrupt(dir,
                       R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                       {1, 2});
  CHECK(contains(error.message(), "\"t\" appears more than once"));

  error = corrupt(dir, R"({"__metadata__":{"format":"pt","step":100}})", {});
  CHECK(contains(error.message(), "__metadata__ \"step\" is number (100), expected a string"));
  CHECK(contains(corrupt(dir, R"({"__metadata__":["pt"]})", {}).message(),
                 "__metadata__ is array, expected an object of strings"));
}

TEST_CASE("every problem of a header is reported, one line each", "[io][safetensors][corrupt]") {
  TempDir dir;
  const auto error = corrupt(dir,
                             R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]},)"
                             R"("b":{"dtype":"U8","shape":[-2],"data_offsets":[1,3]},)"
                             R"("c":{"dtype":"U8","shape":[2],"data_offsets":[3,99]}})",
                             pattern_bytes(4, 0));
  REQUIRE(error.details().size() == 3);
  CHECK(contains(error.details()[0], "tensor \"a\": unknown dtype \"Q4\""));
  CHECK(contains(error.details()[1], "tensor \"b\": shape[0] is -2"));
  CHECK(contains(error.details()[2], "tensor \"c\": data_offsets [3, 99] end beyond"));
  CHECK(contains(error.message(), "(and 2 more problems)"));
}

TEST_CASE("headers from other writers: whitespace, no padding, any key order", "[io][safetensors][corrupt]") {
  TempDir dir;
  write_raw(dir / "spaced",
            "  {\n  \"t\": {\"data_offsets\": [0, 2], \"shape\": [1], \"dtype\": \"F16\"},\n"
            "  \"__metadata__\": {}\n}\n   ",
            {0x00, 0x3c});
  const SafetensorsFile file = SafetensorsFile::open(dir / "spaced");
  CHECK(file.names() == std::vector<std::string>{"t"});
  CHECK(file.info("t").dtype == attnplan::io::Dtype::f16);
  CHECK(file.metadata().empty());
}
