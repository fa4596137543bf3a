// libFuzzer harness for io::SafetensorsFile: arbitrary bytes as a .safetensors file.
// The reader only takes a path (it memory-maps the file), so each input goes through a scratch file.
// Expected outcomes: an opened file whose every tensor's bytes can be read, or Error(input). Reading
// every byte is the point: an accepted header must never point outside the mapping. ASan does not guard
// mmap'd memory, so each view is also checked against the file size explicitly.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "core/error.hpp"
#include "fuzz_support.hpp"
#include "io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnplan;
  static const fuzz::ScratchPath scratch("input.safetensors");
  const std::filesystem::path& path = scratch.get();
  fuzz::write_bytes(path, data, size);
  try {
    const io::SafetensorsFile file = io::SafetensorsFile::open(path);
    std::uint64_t checksum = 0;
    for (const std::string& name : file.names()) {
      const io::TensorInfo& info = file.info(name);
      const auto bytes = file.bytes(name);
      // The invariants the header promises: size = elements * element size, and inside the file.
      if (bytes.size() != info.byte_size()) __builtin_trap();
      if (info.element_count() * io::element_size(info.dtype) != info.byte_size()) __builtin_trap();
      if (file.data_start() + info.end > size) __builtin_trap();
      if (!bytes.empty() && bytes.data() == nullptr) __builtin_trap();
      for (const std::uint8_t byte : bytes) checksum += byte;
    }
    for (const auto& [key, value] : file.metadata()) checksum += key.size() + value.size();
    // Keeps the reads above from being optimized away.
    asm volatile("" : : "r"(checksum) : "memory");
  } catch (const Error&) {
    // refused: the expected outcome for malformed files
  }
  return 0;
}
