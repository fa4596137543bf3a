// The cache key of a compiled kernel: SHA-256 over everything that can change its cubin.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/compiler.hpp"

namespace attnplan::compiler {

// Everything the key covers, kept apart so that a manifest can record it and `attnplan cache` can say
// which input changed when a key misses.
struct KeyInputs {
  int format_version = 0;       // the cache's on-disk format version
  std::string nvrtc_version;    // "13.0": the compiler
  std::string toolkit_headers;  // "13.0": CUDA_VERSION of the toolkit headers it included
  std::string arch;             // "sm_90a"
  // The NVRTC options, in order, with each toolkit include path written relative to the toolkit root
  // ("-I<cuda>/include", "-I<cuda>/include/cccl"); every other option verbatim.
  std::vector<std::string> options;
  std::string stub;                                          // the rendered instantiation stub
  std::vector<std::pair<std::string, std::string>> headers;  // include closure: (name, SHA-256 hex), sorted

  nlohmann::json to_json() const;
  // Reads what to_json wrote. Throws Error(cache) naming the field if `json` does not have that shape.
  static KeyInputs from_json(const nlohmann::json& json);
  friend bool operator==(const KeyInputs&, const KeyInputs&) = default;
};

// The key inputs of compiling `source` with `options`. Only the headers in the stub header's include
// closure count: the others are handed to NVRTC but cannot reach the binary.
//
// Toolkit paths: the -I options name the toolkit's absolute install prefix, which differs between machines
// that hold the same toolkit (/usr/local/cuda-13.0, /opt/cuda, a conda env). The key replaces that prefix
// by "<cuda>" and identifies the toolkit by the NVRTC version and the headers' CUDA_VERSION instead, so
// such machines share cubins. The cubin itself does not record the prefix (checked with NVRTC 13.0
// and -lineinfo: identical bytes from two prefixes). Never file times.
KeyInputs key_inputs(const KernelSource& source, const CompileOptions& options, const Toolkit& toolkit,
                     const TemplateLibrary& templates, int format_version);

// SHA-256 over every field of `inputs`, each length-prefixed and each list preceded by its size, as 64
// lowercase hex digits.
std::string cache_key(const KeyInputs& inputs);

// One line per field that differs between `cached` and `wanted`, e.g. "header attnplan/common.cuh changed";
// empty when they are equal. For explaining a cache miss.
std::vector<std::string> key_differences(const KeyInputs& cached, const KeyInputs& wanted);

}  // namespace attnplan::compiler
