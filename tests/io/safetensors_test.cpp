// SafetensorsWriter -> SafetensorsFile round trips, the exact bytes the writer produces (checked against
// the format's layout without the reader), metadata, and the writer's and reader's API errors.
#include "io/safetensors.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/files.hpp"
#include "io/dtype.hpp"
#include "io_testing.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"

using attnplan::Error;
using attnplan::Stage;
using attnplan::io::Dtype;
using attnplan::io::element_size;
using attnplan::io::SafetensorsFile;
using attnplan::io::SafetensorsWriter;
using attnplan::io::testing::le64;
using attnplan::io::testing::open_error;
using attnplan::io::testing::pattern_bytes;
using attnplan::testing::TempDir;

namespace {

constexpr Dtype kAllDtypes[] = {Dtype::bf16,    Dtype::f16, Dtype::f32,  Dtype::f64, Dtype::f8_e4m3,
                                Dtype::f8_e5m2, Dtype::u8,  Dtype::i8,   Dtype::i16, Dtype::i32,
                                Dtype::u32,     Dtype::i64, Dtype::bool_};

}  // namespace

TEST_CASE("every dtype round-trips through a file, in insertion order", "[io][safetensors]") {
  TempDir dir;
  SafetensorsWriter writer;
  std::vector<std::string> names;
  unsigned seed = 0;
  for (const Dtype dtype : kAllDtypes) {
    // Names out of alphabetical order, so an order that merely sorts names would show.
    const std::string name = "z" + std::to_string(100 - seed) + "." + std::string(to_string(dtype));
    writer.add(name, dtype, {2, 3}, pattern_bytes(6 * element_size(dtype), seed++));
    names.push_back(name);
  }
  writer.write(dir / "all.safetensors");

  const SafetensorsFile file = SafetensorsFile::open(dir / "all.safetensors");
  CHECK(file.path() == dir / "all.safetensors");
  CHECK(file.names() == names);
  CHECK(file.metadata().empty());
  CHECK(file.data_start() % 8 == 0);
  const std::vector<std::uint8_t> raw = attnplan::core::read_binary_file(dir / "all.safetensors");
  seed = 0;
  for (const Dtype dtype : kAllDtypes) {
    const std::string& name = names[seed];
    CAPTURE(name);
    REQUIRE(file.contains(name));
    CHECK(file.info(name).dtype == dtype);
    CHECK(file.info(name).shape == std::vector<std::int64_t>{2, 3});
    CHECK(file.info(name).element_count() == 6);
    CHECK(file.info(name).byte_size() == 6 * element_size(dtype));
    const auto bytes = file.bytes(name);
    CHECK(std::vector<std::uint8_t>(bytes.begin(), bytes.end()) ==
          pattern_bytes(6 * element_size(dtype), seed++));
    // The same bytes at the absolute file offsets data_start() gives, for readers that bypass the mapping.
    const auto at = raw.begin() + static_cast<std::ptrdiff_t>(file.data_start() + file.info(name).begin);
    CHECK(std::equal(bytes.begin(), bytes.end(), at));
  }
}

TEST_CASE("scalars, zero-size tensors and a file without tensors round-trip", "[io][safetensors]") {
  TempDir dir;
  SafetensorsWriter writer;
  writer.add("scalar", Dtype::f32, {}, pattern_bytes(4, 1));
  writer.add("empty", Dtype::bf16, {0}, {});
  writer.add("empty_inner", Dtype::i64, {3, 0, 5}, {});
  writer.add("after", Dtype::u8, {3}, pattern_bytes(3, 2));
  writer.add("empty_last", Dtype::f16, {4, 0}, {});
  writer.write(dir / "edge.safetensors");

  const SafetensorsFile file = SafetensorsFile::open(dir / "edge.safetensors");
  CHECK(file.names() == std::vector<std::string>{"scalar", "empty", "empty_inner", "after", "empty_last"});
  CHECK(file.info("scalar").shape.empty());
  CHECK(file.info("scalar").element_count() == 1);
  CHECK(file.bytes("scalar").size() == 4);
  CHECK(file.info("empty_inner").shape == std::vector<std::int64_t>{3, 0, 5});
  CHECK(file.info("empty_inner").element_count() == 0);
  CHECK(file.bytes("empty").empty());
  CHECK(file.bytes("empty_last").empty());
  const auto after = file.bytes("after");
  CHECK(std::vector<std::uint8_t>(after.begin(), after.end()) == pattern_bytes(3, 2));

  SafetensorsWriter nothing;
  nothing.write(dir / "nothing.safetensors");
  CHECK(attnplan::core::read_binary_file(dir / "nothing.safetensors") == [] {
    auto expected = le64(8);
    for (char c : std::string("{}      ")) expected.push_back(static_cast<std::uint8_t>(c));
    return expected;
  }());
  CHECK(SafetensorsFile::open(dir / "nothing.safetensors").names().empty());
}

TEST_CASE("the writer's bytes are exactly length, space-padded header, data", "[io][safetensors]") {
  SafetensorsWriter writer;
  writer.add("w", Dtype::u8, {3}, std::vector<std::uint8_t>{7, 8, 9});
  // Written out by hand: 53 characters, padded with 3 spaces to 56, a multiple of 8.
  const std::string header = R"({"w":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
  REQUIRE(header.size() == 53);
  std::vector<std::uint8_t> expected = le64(56);
  for (char c : header + "   ") expected.push_back(static_cast<std::uint8_t>(c));
  expected.insert(expected.end(), {7, 8, 9});
  CHECK(writer.serialize() == expected);

  SECTION("a header already a multiple of 8 gets no padding") {
    SafetensorsWriter exact;
    exact.add("wxyz", Dtype::u8, {3}, std::vector<std::uint8_t>{7, 8, 9});
    const std::string exact_header = R"({"wxyz":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
    REQUIRE(exact_header.size() == 56);
    std::vector<std::uint8_t> unpadded = le64(56);
    for (char c : exact_header) unpadded.push_back(static_cast<std::uint8_t>(c));
    unpadded.insert(unpadded.end(), {7, 8, 9});
    CHECK(exact.serialize() == unpadded);
  }

  SECTION("metadata comes first, and the padding follows the header's length") {
    writer.set_metadata("format", "pt");
    const std::string with_metadata =
        R"({"__metadata__":{"format":"pt"},"w":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
    REQUIRE(with_metadata.size() == 84);  // 84 % 8 == 4: padded to 88
    std::vector<std::uint8_t> padded = le64(88);
    for (char c : with_metadata + "    ") padded.push_back(static_cast<std::uint8_t>(c));
    padded.insert(padded.end(), {7, 8, 9});
    CHECK(writer.serialize() == padded);

    writer.set_metadata("k", "1234");  // adds ,"k":"1234" (11 characters): 95, padded to 96
    CHECK(writer.serialize().size() == 8 + 96 + 3);
    writer.set_metadata("k", "12345678");  // replaced, not added: 99 -> 104
    CHECK(writer.serialize().size() == 8 + 104 + 3);
  }
}

TEST_CASE("files from the writer follow the format's layout, checked without the reader",
          "[io][safetensors]") {
  TempDir dir;
  SafetensorsWriter writer;
  // Odd byte counts, so the data offsets are not all multiples of anything.
  writer.add("a.odd", Dtype::u8, {3}, pattern_bytes(3, 1));
  writer.add("b.f32", Dtype::f32, {2, 2}, pattern_bytes(16, 2));
  writer.add("c.bool", Dtype::bool_, {5}, std::vector<std::uint8_t>{1, 0, 1, 1, 0});
  writer.add("d.bf16", Dtype::bf16, {7}, pattern_bytes(14, 3));
  writer.set_metadata("format", "pt");
  writer.write(dir / "layout.safetensors");

  const std::vector<std::uint8_t> file = attnplan::core::read_binary_file(dir / "layout.safetensors");
  REQUIRE(file.size() >= 8);
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | file[static_cast<std::size_t>(i)];
  CHECK((8 + header_size) % 8 == 0);  // the data section starts aligned
  REQUIRE(8 + header_size <= file.size());
  const std::string header_text(file.begin() + 8,
                                file.begin() + 8 + static_cast<std::ptrdiff_t>(header_size));
  CHECK(header_text.front() == '{');
  const auto json_end = header_text.find_last_not_of(' ');
  CHECK(header_text[json_end] == '}');  // only spaces pad the JSON
  const auto header = nlohmann::json::parse(header_text);
  CHECK(header.at("__metadata__") == nlohmann::json{{"format", "pt"}});

  const std::uint64_t data_size = file.size() - 8 - header_size;
  // The format wants the data section fully indexed: the tensors tile it without gaps, in insertion order.
  std::uint64_t next = 0;
  for (const auto& [name, dtype, shape, bytes] :
       {std::tuple{"a.odd", "U8", std::vector<int>{3}, pattern_bytes(3, 1)},
        std::tuple{"b.f32", "F32", std::vector<int>{2, 2}, pattern_bytes(16, 2)},
        std::tuple{"c.bool", "BOOL", std::vector<int>{5}, std::vector<std::uint8_t>{1, 0, 1, 1, 0}},
        std::tuple{"d.bf16", "BF16", std::vector<int>{7}, pattern_bytes(14, 3)}}) {
    CAPTURE(name);
    const auto& entry = header.at(name);
    CHECK(entry.size() == 3);
    CHECK(entry.at("dtype") == dtype);
    CHECK(entry.at("shape") == nlohmann::json(shape));
    const auto begin = entry.at("data_offsets").at(0).get<std::uint64_t>();
    const auto end = entry.at("data_offsets").at(1).get<std::uint64_t>();
    CHECK(begin == next);
    CHECK(end - begin == bytes.size());
    const auto data_begin = file.begin() + static_cast<std::ptrdiff_t>(8 + header_size + begin);
    CHECK(std::vector<std::uint8_t>(data_begin, data_begin + static_cast<std::ptrdiff_t>(bytes.size())) ==
          bytes);
    next = end;
  }
  CHECK(next == data_size);
  CHECK(header.size() == 5);
}

TEST_CASE("metadata round-trips as a string map", "[io][safetensors]") {
  TempDir dir;
  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  writer.set_metadata("note", "unicode \xc3\xa9 and \"quotes\"");
  writer.set_metadata("format", "attnplan");  // replaces
  writer.add("x", Dtype::i32, {1}, pattern_bytes(4, 0));
  writer.write(dir / "meta.safetensors");

  const SafetensorsFile file = SafetensorsFile::open(dir / "meta.safetensors");
  CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "attnplan"},
                                                              {"note", "unicode \xc3\xa9 and \"quotes\""}});
  CHECK(file.names() == std::vector<std::string>{"x"});
}

TEST_CASE("the writer refuses tensors the format cannot hold", "[io][safetensors]") {
  SafetensorsWriter writer;
  writer.add("x", Dtype::f32, {2}, pattern_bytes(8, 0));

  auto error = expect_error([&] { writer.add("x", Dtype::f32, {2}, pattern_bytes(8, 0)); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), "\"x\" added twice"));

  error = expect_error([&] { writer.add("", Dtype::u8, {0}, {}); });
  CHECK(contains(error.message(), "cannot name a tensor"));
  error = expect_error([&] { writer.add("__metadata__", Dtype::u8, {0}, {}); });
  CHECK(contains(error.message(), "\"__metadata__\" cannot name a tensor"));

  error = expect_error([&] { writer.add("neg", Dtype::u8, {2, -1}, {}); });
  CHECK(contains(error.message(), "negative extent in shape [2, -1]"));

  error = expect_error([&] { writer.add("short", Dtype::bf16, {2, 3}, pattern_bytes(11, 0)); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), "tensor \"short\" has 11 bytes but shape [2, 3] of BF16 needs 12"));

  error = expect_error([&] { writer.add("huge", Dtype::i16, {std::int64_t{1} << 62, 8}, {}); });
  CHECK(contains(error.message(), "needs more than 2^64"));

  // A name that is not UTF-8 cannot be written into a JSON header.
  writer.add("bad\xff", Dtype::u8, {0}, {});
  error = expect_error([&] { writer.serialize(); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), "cannot encode the header"));
}

TEST_CASE("writing to a path that cannot be written is an input error naming it", "[io][safetensors]") {
  TempDir dir;
  SafetensorsWriter writer;
  const auto error = expect_error([&] { writer.write(dir / "no-such-dir" / "x.safetensors"); });
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), (dir / "no-such-dir" / "x.safetensors").string()));
}

TEST_CASE("lookups of absent tensors name the tensor and the file", "[io][safetensors]") {
  TempDir dir;
  SafetensorsWriter writer;
  writer.add("present", Dtype::u8, {1}, std::vector<std::uint8_t>{42});
  writer.write(dir / "one.safetensors");
  const SafetensorsFile file = SafetensorsFile::open(dir / "one.safetensors");

  CHECK(file.contains("present"));
  CHECK_FALSE(file.contains("absent"));
  CHECK_FALSE(file.contains("presen"));
  for (const auto& error :
       {expect_error([&] { file.info("absent"); }), expect_error([&] { file.bytes("absent"); })}) {
    CHECK(error.stage() == Stage::input);
    CHECK(contains(error.message(), "no tensor named \"absent\""));
    CHECK(contains(error.message(), (dir / "one.safetensors").string()));
  }
}

TEST_CASE("views stay valid when the file object moves", "[io][safetensors]") {
  TempDir dir;
  SafetensorsWriter writer;
  writer.add("t", Dtype::u8, {4}, std::vector<std::uint8_t>{1, 2, 3, 4});
  writer.write(dir / "t.safetensors");

  SafetensorsFile first = SafetensorsFile::open(dir / "t.safetensors");
  const auto view = first.bytes("t");
  SafetensorsFile moved = std::move(first);
  CHECK(moved.bytes("t").data() == view.data());  // the mapping moved along, not copied
  CHECK(std::vector<std::uint8_t>(view.begin(), view.end()) == std::vector<std::uint8_t>{1, 2, 3, 4});

  // Rewriting the path publishes a new file; the open mapping keeps the old contents.
  SafetensorsWriter other;
  other.add("t", Dtype::u8, {4}, std::vector<std::uint8_t>{9, 9, 9, 9});
  other.write(dir / "t.safetensors");
  CHECK(std::vector<std::uint8_t>(view.begin(), view.end()) == std::vector<std::uint8_t>{1, 2, 3, 4});
  const SafetensorsFile reopened = SafetensorsFile::open(dir / "t.safetensors");
  CHECK(reopened.bytes("t")[0] == 9);
}

TEST_CASE("opening what is not a readable regular file is an input error naming the path",
          "[io][safetensors]") {
  TempDir dir;
  auto error = open_error(dir / "missing.safetensors");
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), (dir / "missing.safetensors").string()));

  error = open_error(dir.path());
  CHECK(error.stage() == Stage::input);
  CHECK(contains(error.message(), "not a regular file"));
}
