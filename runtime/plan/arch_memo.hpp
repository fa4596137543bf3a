// What "auto" resolved to on this machine, remembered in the cache directory, so that compiling a cached
// plan never pays for initializing CUDA (cuInit alone is ~230 ms on an H200 host, more than the whole warm
// compile). The memo is keyed by what identifies the device without initializing CUDA: the driver version
// and every GPU's model and bus id as the NVIDIA kernel module lists them under /proc, plus the device
// ordinal and CUDA_VISIBLE_DEVICES. Any change of those reads as a new machine.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "config/target.hpp"

namespace attnplan::plan {

// The identity above, or nullopt where the NVIDIA kernel module is not loaded (then there is no device to
// ask either, and resolving "auto" is cheap).
std::optional<std::string> device_identity(const std::filesystem::path& proc_root, int ordinal,
                                           const std::optional<std::string>& visible_devices);

// The remembered arch for `identity`, if any. Never throws: an unreadable memo is no memo.
std::optional<config::Arch> remembered_arch(const std::filesystem::path& cache_dir,
                                            const std::string& identity);

// Records `arch` for `identity` (crash-safe publish). Never throws: an unwritable cache just forgets.
void remember_arch(const std::filesystem::path& cache_dir, const std::string& identity,
                   const config::Arch& arch);

}  // namespace attnplan::plan
