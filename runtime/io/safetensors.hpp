// Reading and writing the safetensors format (https://huggingface.co/docs/safetensors):
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  a JSON object: {"__metadata__": {str: str}, name: {"dtype": "BF16", "shape": [..],
//              "data_offsets": [begin, end]}, ...}, possibly padded with trailing spaces
//   [rest]     the data section; a tensor's bytes are data[begin, end), row-major, little-endian
//
// What the reader accepts (every violation is an Error(input) naming the file and the tensor):
//   - strict: the header length (at most 100 MiB, within the file), the JSON (an object, nested at most 16
//     deep), the entry schema (exactly dtype, shape, data_offsets; metadata values are strings), dtype
//     names, shapes (non-negative integers), offsets within the data section, byte length ==
//     product(shape) * element size (computed with overflow checks, so a header claiming terabytes is
//     rejected before anything is touched), no two tensors sharing a byte, no duplicate names.
//   - lenient: bytes of the data section that no tensor covers (gaps, trailing bytes). The format asks
//     writers to index the whole buffer, but unreferenced bytes cannot be misread, so they are not worth
//     refusing a checkpoint over. Zero-size tensors cover no bytes and overlap nothing.
// The writer produces files the strict reference reader (the Rust `safetensors` crate) also accepts:
// tensors packed back to back in insertion order, no gaps.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/dtype.hpp"
#include "io/mapped_file.hpp"

namespace attnplan::io {

// The header's largest accepted length. Real headers are kilobytes to a few MB; a bigger length means
// a corrupt or hostile file, and refusing it keeps a bad file from making us parse gigabytes of JSON.
inline constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{100} << 20;

struct TensorInfo {
  Dtype dtype = Dtype::u8;
  std::vector<std::int64_t> shape;  // outermost first; [] is a scalar (one element)
  std::uint64_t begin = 0;          // byte offsets into the data section, end exclusive
  std::uint64_t end = 0;

  std::uint64_t byte_size() const noexcept { return end - begin; }
  std::uint64_t element_count() const noexcept;  // product of shape (validated not to overflow)
};

// An opened file: the header parsed and validated, the data mapped read-only (see MappedFile). Move-only;
// bytes() views stay valid while the file object (or the one it moved into) lives. Immutable once open,
// so any number of threads may read from one object.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const noexcept { return path_; }
  // Tensor names in the order of their data in the file: insertion order for files SafetensorsWriter wrote.
  const std::vector<std::string>& names() const noexcept { return names_; }
  bool contains(std::string_view name) const;
  // Throws Error(input) naming the tensor and the file when it is absent.
  const TensorInfo& info(std::string_view name) const;
  // The tensor's raw bytes (little-endian elements). No alignment is promised: copy before typed access.
  std::span<const std::uint8_t> bytes(std::string_view name) const;
  // The "__metadata__" map; empty when the header has none.
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  // Where the data section starts in the file (8 + header length): a tensor's bytes are at file offsets
  // [data_start() + begin, data_start() + end), for readers that load straight from the file (pread, cuFile).
  std::uint64_t data_start() const noexcept { return data_start_; }

 private:
  SafetensorsFile(std::filesystem::path path, MappedFile mapping)
      : path_(std::move(path)), mapping_(std::move(mapping)) {}

  std::filesystem::path path_;
  MappedFile mapping_;
  std::uint64_t data_start_ = 0;
  std::span<const std::uint8_t> data_;  // the data section, inside mapping_
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors and metadata, then writes one file. Copies the tensors' bytes on add(), so the caller's
// buffers need not outlive it.
class SafetensorsWriter {
 public:
  // Throws Error(input): empty name, "__metadata__", a name added before, a negative extent, or
  // bytes.size() != product(shape) * element_size(dtype).
  void add(std::string name, Dtype dtype, std::vector<std::int64_t> shape,
           std::span<const std::uint8_t> bytes);
  // Sets (or replaces) one "__metadata__" entry.
  void set_metadata(std::string key, std::string value);

  // The whole file's bytes: header length, header padded with spaces so the data section starts at a
  // multiple of 8, then the tensors back to back in insertion order.
  std::vector<std::uint8_t> serialize() const;
  // serialize() published with core::write_file_atomic: readers see the old file or the new one, whole.
  // Throws Error(input) naming the path when it cannot be written.
  void write(const std::filesystem::path& path) const;

 private:
  struct Entry {
    std::string name;
    Dtype dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::set<std::string, std::less<>> names_;                   // of entries_, for the duplicate check
  std::vector<std::pair<std::string, std::string>> metadata_;  // insertion order, keys unique
};

}  // namespace attnplan::io
