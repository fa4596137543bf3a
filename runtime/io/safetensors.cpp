#include "io/safetensors.hpp"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/files.hpp"
#include "io/checked_math.hpp"

namespace attnplan::io {
namespace {

using nlohmann::json;

constexpr std::size_t kLengthBytes = 8;  // the little-endian u64 in front of the header
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr int kMaxHeaderDepth = 16;

std::uint64_t read_u64_le(std::span<const std::uint8_t> bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < kLengthBytes; ++i) value |= std::uint64_t{bytes[i]} << (8 * i);
  return value;
}

// "[1, 2, 3]" for shapes and offsets in messages.
template <class Range>
std::string bracketed(const Range& values) {
  return fmt::format("[{}]", fmt::join(values, ", "));
}

// A JSON value as it appears in the header, shortened so that a huge bad value cannot flood a message.
std::string quote_value(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

// nlohmann's what() starts with "[json.exception.parse_error.101] "; the rest is what a user needs.
std::string without_exception_id(const char* what) {
  std::string_view text(what);
  if (const auto end = text.find("] ");
      !text.empty() && text.front() == '[' && end != std::string_view::npos) {
    text.remove_prefix(end + 2);
  }
  return std::string(text);
}

// Non-negative integers only: the parser stores every non-negative integer literal as unsigned, so a
// signed value here is negative, and a float (2.0 included) is not an integer the format allows.
std::optional<std::uint64_t> as_unsigned(const json& value) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  return std::nullopt;
}

// Reads one tensor entry; appends a problem per violation, returns the info only when the entry is sound.
std::optional<TensorInfo> read_tensor_entry(const std::string& name, const json& entry,
                                            std::uint64_t data_size, std::vector<std::string>& problems) {
  const auto problem = [&](std::string text) {
    problems.push_back(fmt::format("tensor \"{}\": {}", name, text));
  };
  if (!entry.is_object()) {
    problem(fmt::format("entry is {} ({}), expected an object with dtype, shape and data_offsets",
                        entry.type_name(), quote_value(entry)));
    return std::nullopt;
  }
  const std::size_t problems_before = problems.size();
  for (const auto& item : entry.items()) {
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets") {
      problem(
          fmt::format("unknown key \"{}\" (a tensor entry has dtype, shape and data_offsets)", item.key()));
    }
  }

  TensorInfo info;
  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    problem(dtype_it == entry.end() ? "no \"dtype\""
                                    : fmt::format("dtype {} is not a string", quote_value(*dtype_it)));
  } else if (const auto dtype = dtype_from_name(dtype_it->get<std::string>())) {
    info.dtype = *dtype;
  } else {
    problem(fmt::format("unknown dtype {} (attnplan reads {})", quote_value(*dtype_it), dtype_name_list()));
  }

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    problem(shape_it == entry.end() ? "no \"shape\""
                                    : fmt::format("shape {} is not an array", quote_value(*shape_it)));
  } else {
    for (std::size_t i = 0; i < shape_it->size(); ++i) {
      const auto extent = as_unsigned((*shape_it)[i]);
      if (!extent || *extent > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        problem(
            fmt::format("shape[{}] is {}, expected a non-negative integer", i, quote_value((*shape_it)[i])));
      } else {
        info.shape.push_back(static_cast<std::int64_t>(*extent));
      }
    }
  }

  const auto offsets_it = entry.find("data_offsets");
  std::optional<std::uint64_t> begin, end;
  if (offsets_it != entry.end() && offsets_it->is_array() && offsets_it->size() == 2) {
    begin = as_unsigned((*offsets_it)[0]);
    end = as_unsigned((*offsets_it)[1]);
  }
  if (!begin || !end) {
    problem(offsets_it == entry.end()
                ? std::string("no \"data_offsets\"")
                : fmt::format("data_offsets {} is not [begin, end] of two non-negative integers",
                              quote_value(*offsets_it)));
  } else if (*begin > *end) {
    problem(fmt::format("data_offsets [{}, {}] has begin after end", *begin, *end));
  } else if (*end > data_size) {
    problem(
        fmt::format("data_offsets [{}, {}] end beyond the data section ({} bytes)", *begin, *end, data_size));
  } else {
    info.begin = *begin;
    info.end = *end;
  }
  if (problems.size() != problems_before) return std::nullopt;

  // Only now is the shape trusted; the size is computed with overflow checks so that a header claiming an
  // absurd tensor is an error here and never reaches an allocation or a read.
  const auto element_count = checked_product(info.shape);
  const auto byte_count = element_count ? checked_multiply(*element_count, element_size(info.dtype))
                                        : std::optional<std::uint64_t>();
  if (!byte_count) {
    problem(fmt::format("shape {} of {} overflows 64-bit byte counts", bracketed(info.shape),
                        to_string(info.dtype)));
    return std::nullopt;
  }
  if (*byte_count != info.byte_size()) {
    problem(fmt::format("data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", info.begin,
                        info.end, info.byte_size(), bracketed(info.shape), to_string(info.dtype),
                        *byte_count));
    return std::nullopt;
  }
  return info;
}

void read_metadata(const json& entry, std::map<std::string, std::string>& metadata,
                   std::vector<std::string>& problems) {
  if (!entry.is_object()) {
    problems.push_back(fmt::format("__metadata__ is {}, expected an object of strings", entry.type_name()));
    return;
  }
  for (const auto& item : entry.items()) {
    if (item.value().is_string()) {
      metadata.emplace(item.key(), item.value().get<std::string>());
    } else {
      problems.push_back(fmt::format("__metadata__ \"{}\" is {} ({}), expected a string", item.key(),
                                     item.value().type_name(), quote_value(item.value())));
    }
  }
}

// Zero-size tensors cover no bytes, so they are left out; the rest, ordered by begin, must not intersect.
void check_overlaps(const std::map<std::string, TensorInfo, std::less<>>& tensors,
                    std::vector<std::string>& problems) {
  std::vector<std::pair<const std::string*, const TensorInfo*>> ranges;
  for (const auto& [name, info] : tensors) {
    if (info.byte_size() > 0) ranges.emplace_back(&name, &info);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  // Compare each range with the furthest-reaching one before it, which catches a tensor nested in another
  // even when a smaller one sits between them.
  const std::pair<const std::string*, const TensorInfo*>* reach = nullptr;
  for (const auto& current : ranges) {
    if (reach != nullptr && current.second->begin < reach->second->end) {
      problems.push_back(fmt::format("tensors \"{}\" [{}, {}) and \"{}\" [{}, {}) overlap", *reach->first,
                                     reach->second->begin, reach->second->end, *current.first,
                                     current.second->begin, current.second->end));
    }
    if (reach == nullptr || current.second->end > reach->second->end) reach = &current;
  }
}

}  // namespace

std::uint64_t TensorInfo::element_count() const noexcept {
  return checked_product(shape).value_or(0);
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile file(path, MappedFile::open(path));
  const std::span<const std::uint8_t> bytes = file.mapping_.bytes();
  const std::string source = path.string();

  if (bytes.size() < kLengthBytes) {
    throw Error(Stage::input,
                fmt::format("{}: {} bytes is too short for a safetensors file, which starts with an "
                            "8-byte header length",
                            source, bytes.size()));
  }
  const std::uint64_t header_size = read_u64_le(bytes);
  const std::uint64_t after_length = bytes.size() - kLengthBytes;
  if (header_size > kMaxHeaderBytes) {
    throw Error(Stage::input, fmt::format("{}: header length {} bytes is absurd (more than {} MiB): not a "
                                          "safetensors file, or a corrupt one",
                                          source, header_size, kMaxHeaderBytes >> 20));
  }
  if (header_size > after_length) {
    throw Error(Stage::input,
                fmt::format("{}: header length {} bytes goes beyond the end of the file ({} bytes "
                            "after the length): truncated or not a safetensors file",
                            source, header_size, after_length));
  }
  const auto header_bytes = bytes.subspan(kLengthBytes, header_size);
  file.data_start_ = kLengthBytes + header_size;
  file.data_ = bytes.subspan(file.data_start_);

  // Two checks while parsing, which the parsed value can no longer show. Duplicate names would silently
  // collapse into one entry: keys at depth 1 are the top-level names. And a real header nests three levels
  // (header, entry, shape); a hostile one nested millions deep would only cost stack when walked later.
  std::set<std::string, std::less<>> seen;
  std::vector<std::string> problems;
  const auto watch = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      auto name = parsed.get<std::string>();
      if (!seen.insert(name).second) problems.push_back(fmt::format("\"{}\" appears more than once", name));
    }
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxHeaderDepth) {
      throw Error(Stage::input,
                  fmt::format("{}: the header nests deeper than {} levels, which no safetensors "
                              "header does",
                              source, kMaxHeaderDepth));
    }
    return true;
  };
  json header;
  try {
    header = json::parse(header_bytes.begin(), header_bytes.end(), watch);
  } catch (const json::exception& error) {
    throw Error(Stage::input, fmt::format("{}: the header is not valid JSON ({})", source,
                                          without_exception_id(error.what())));
  }
  if (!header.is_object()) {
    throw Error(Stage::input,
                fmt::format("{}: the header is a JSON {}, not an object", source, header.type_name()));
  }

  for (const auto& item : header.items()) {
    if (item.key() == kMetadataKey) {
      read_metadata(item.value(), file.metadata_, problems);
    } else if (auto info = read_tensor_entry(item.key(), item.value(), file.data_.size(), problems)) {
      file.tensors_.emplace(item.key(), std::move(*info));
    }
  }
  check_overlaps(file.tensors_, problems);
  if (!problems.empty()) {
    std::string message = fmt::format("{}: invalid safetensors header: {}", source, problems.front());
    if (problems.size() > 1) message += fmt::format(" (and {} more problems)", problems.size() - 1);
    throw Error(Stage::input, std::move(message), {}, std::move(problems));
  }

  for (const auto& [name, info] : file.tensors_) file.names_.push_back(name);
  // File order; the name breaks ties between zero-size tensors at one offset so the order is deterministic.
  std::sort(file.names_.begin(), file.names_.end(), [&](const std::string& a, const std::string& b) {
    const TensorInfo& left = file.tensors_.find(a)->second;
    const TensorInfo& right = file.tensors_.find(b)->second;
    return std::tie(left.begin, left.end, a) < std::tie(right.begin, right.end, b);
  });
  return file;
}

bool SafetensorsFile::contains(std::string_view name) const {
  return tensors_.find(name) != tensors_.end();
}

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    throw Error(Stage::input, fmt::format("{}: no tensor named \"{}\" (the file has {} tensors)",
                                          path_.string(), name, tensors_.size()));
  }
  return it->second;
}

std::span<const std::uint8_t> SafetensorsFile::bytes(std::string_view name) const {
  const TensorInfo& tensor = info(name);
  return data_.subspan(tensor.begin, tensor.byte_size());
}

void SafetensorsWriter::add(std::string name, Dtype dtype, std::vector<std::int64_t> shape,
                            std::span<const std::uint8_t> bytes) {
  if (name.empty() || name == kMetadataKey) {
    throw Error(Stage::input, fmt::format("safetensors writer: \"{}\" cannot name a tensor", name));
  }
  if (names_.count(name) != 0) {
    throw Error(Stage::input, fmt::format("safetensors writer: tensor \"{}\" added twice", name));
  }
  if (std::any_of(shape.begin(), shape.end(), [](std::int64_t extent) { return extent < 0; })) {
    throw Error(Stage::input,
                fmt::format("safetensors writer: tensor \"{}\" has a negative extent in shape {}", name,
                            bracketed(shape)));
  }
  const auto element_count = checked_product(shape);
  const auto byte_count =
      element_count ? checked_multiply(*element_count, element_size(dtype)) : std::optional<std::uint64_t>();
  if (!byte_count || *byte_count != bytes.size()) {
    throw Error(Stage::input,
                fmt::format("safetensors writer: tensor \"{}\" has {} bytes but shape {} of {} needs {}",
                            name, bytes.size(), bracketed(shape), to_string(dtype),
                            byte_count ? fmt::format("{}", *byte_count) : std::string("more than 2^64")));
  }
  names_.insert(name);
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), {bytes.begin(), bytes.end()}});
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  for (auto& [existing_key, existing_value] : metadata_) {
    if (existing_key == key) {
      existing_value = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

std::vector<std::uint8_t> SafetensorsWriter::serialize() const {
  // ordered_json keeps insertion order, so the header lists the tensors in the order of their data.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    auto& metadata = header[std::string(kMetadataKey)];
    metadata = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata_) metadata[key] = value;
  }
  std::uint64_t offset = 0;
  for (const Entry& entry : entries_) {
    const std::uint64_t end = offset + entry.bytes.size();
    header[entry.name] = {{"dtype", to_string(entry.dtype)},
                          {"shape", entry.shape},
                          {"data_offsets", nlohmann::ordered_json::array({offset, end})}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& error) {  // a name or metadata string that is not UTF-8
    throw Error(Stage::input, fmt::format("safetensors writer: cannot encode the header: {}",
                                          without_exception_id(error.what())));
  }
  // Spaces are JSON whitespace, so readers skip them; they make the data section start 8-byte aligned.
  text.append((kLengthBytes - text.size() % kLengthBytes) % kLengthBytes, ' ');
  if (text.size() > kMaxHeaderBytes) {
    throw Error(Stage::input,
                fmt::format("safetensors writer: the header would be {} bytes, more than readers "
                            "accept ({} MiB)",
                            text.size(), kMaxHeaderBytes >> 20));
  }

  std::vector<std::uint8_t> file;
  file.reserve(kLengthBytes + text.size() + offset);
  for (std::size_t i = 0; i < kLengthBytes; ++i)
    file.push_back(static_cast<std::uint8_t>(text.size() >> (8 * i)));
  file.insert(file.end(), text.begin(), text.end());
  for (const Entry& entry : entries_) file.insert(file.end(), entry.bytes.begin(), entry.bytes.end());
  return file;
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  const std::vector<std::uint8_t> file = serialize();
  try {
    core::write_file_atomic(path, file.data(), file.size());
  } catch (const Error& error) {
    // core reports its writes as cache errors; here the path is the user's output file.
    throw Error(Stage::input, error.message(), error.payload(), error.details());
  }
}

}  // namespace attnplan::io
