// Helpers shared by the kernel spec tests: a compiler over the source tree's templates, the archs the
// tests name, and fake device addresses for host-side checks.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "attnplan/gemm_params.h"
#include "compiler/compiler.hpp"
#include "config/attention_config.hpp"
#include "config/target.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

namespace attnplan::plan_testing {

inline constexpr config::Arch kSm80{8, 0, false};
inline constexpr config::Arch kSm86{8, 6, false};
inline constexpr config::Arch kSm89{8, 9, false};
inline constexpr config::Arch kSm90a{9, 0, true};
inline constexpr config::Arch kSm100a{10, 0, true};

// NVRTC over templates/ as checked out (so a template edit is tested without a rebuild of the embedding),
// or over ATTNPLAN_TEMPLATE_DIR when it is set, as test_gpu and attnplan take it: a copy of the templates
// gets its registers, spills and wgmma checks here before it is timed on a GPU.
inline const compiler::Compiler& source_tree_compiler() {
  static const compiler::Compiler instance = [] {
    const char* const override_dir = std::getenv("ATTNPLAN_TEMPLATE_DIR");
    const std::string dir = override_dir != nullptr && *override_dir != '\0'
                                ? std::string(override_dir)
                                : std::string(ATTNPLAN_SOURCE_DIR) + "/templates";
    return compiler::Compiler(compiler::Toolkit::locate({}, {}, {}),
                              compiler::TemplateLibrary::from_directory(dir));
  }();
  return instance;
}

// What every sm_90a kernel with asynchronous wgmmas must show in its ptxas log: no wgmma register in flight
// where the code reads it (ptxas would inject waits of its own: C7517), and no accumulator or A fragment
// read that ptxas cannot prove complete (C7514: it then serializes every wgmma of the kernel, which silently
// undoes an overlapped schedule or a second partial).
inline void check_wgmma_asynchronous(const compiler::CompiledKernel& kernel) {
  CHECK(kernel.log.find("warpgroup.wait is injected") == std::string::npos);
  CHECK(kernel.log.find("serialized") == std::string::npos);
}

// A warp-specialized GEMM (gemm_sm90*.cuh) compiled for sm_90a with its PTX, and what every one of them
// must show: no spills, no stack, no wgmma serialized or waited on by ptxas, all shared memory dynamic, at
// most 168 registers at launch (65536 / 384; setmaxnreg then moves them to the consumers), TMA loads and the
// consumers' setmaxnreg (232, or the decoding kernel's 208).
inline compiler::CompiledKernel compile_sm90a_gemm(const compiler::KernelSource& source,
                                                   int consumer_registers = 232) {
  INFO(source.render_stub());
  compiler::CompiledKernel kernel =
      source_tree_compiler().compile(source, compiler::CompileOptions{.arch = kSm90a, .keep_ptx = true});
  INFO(kernel.log);
  CHECK(kernel.resources.spill_bytes() == 0);
  CHECK(kernel.resources.stack_bytes == 0);
  check_wgmma_asynchronous(kernel);
  CHECK(kernel.resources.shared_bytes == 0);
  CHECK(kernel.resources.registers <= 168);
  CHECK(kernel.ptx.find("cp.async.bulk.tensor.2d") != std::string::npos);
  CHECK(kernel.ptx.find("setmaxnreg.inc.sync.aligned.u32 " + std::to_string(consumer_registers)) !=
        std::string::npos);
  return kernel;
}

// Device addresses are only checked for alignment, never dereferenced.
template <class T>
T* fake_pointer(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// An encoding of `format` with every other field at its default.
inline config::WeightEncoding weight_format(config::WeightFormat format) {
  config::WeightEncoding result;
  result.format = format;
  return result;
}

// Llama-3.1-8B's q | k | v product (N 6144 = 4096 | 1024 | 1024, K 4096) over fake, aligned device
// addresses, with scales and an nvfp4 scale_2 per segment (what the quantized kernels check for).
inline GemmParams llama_qkv_params(int m) {
  GemmParams params{};
  params.a = fake_pointer<const bf16_bits>(0x10000);
  params.c = fake_pointer<bf16_bits>(0x20000);
  params.m = m;
  params.n = 6144;
  params.k = 4096;
  params.lda = 4096;
  params.ldc = 6144;
  const int bounds[] = {0, 4096, 5120, 6144};
  for (int s = 0; s < 3; ++s) {
    params.segments[s] = {fake_pointer<const bf16_bits>(0x100000 * (s + 1)), nullptr, bounds[s],
                          bounds[s + 1]};
    params.segments[s].scales = fake_pointer<const void>(0x1000000 * (s + 1));
    params.segments[s].scale_2 = fake_pointer<const float>(0x4000000);
  }
  return params;
}

// The SASS of a compiled kernel, through the toolkit's cuobjdump (its bin/, the root's grandparent's bin/
// for a packaged targets/<arch>-linux root, else $PATH). CI's and the development machine's toolkits ship
// none, so the cases that read SASS live in test_gpu (tests/gpu/sass_gpu_test.cpp), which runs on the lent
// GPU machine and is skipped elsewhere: REQUIREs a cuobjdump and its success.
inline std::string disassemble(const compiler::CompiledKernel& kernel) {
  const std::filesystem::path root = source_tree_compiler().toolkit().root;
  std::vector<std::filesystem::path> places{root / "bin", root.parent_path().parent_path() / "bin"};
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    for (std::string rest = path; !rest.empty();) {
      const std::size_t colon = rest.find(':');
      places.emplace_back(rest.substr(0, colon));
      rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
    }
  }
  std::filesystem::path cuobjdump;
  for (const std::filesystem::path& place : places) {
    if (std::filesystem::exists(place / "cuobjdump")) {
      cuobjdump = place / "cuobjdump";
      break;
    }
  }
  INFO("toolkit root " << root.string());
  REQUIRE_FALSE(cuobjdump.empty());
  testing::TempDir dir("attnplan-sass");
  const std::filesystem::path cubin = dir / "kernel.cubin";
  {
    std::FILE* file = std::fopen(cubin.c_str(), "wb");
    REQUIRE(file != nullptr);
    REQUIRE(std::fwrite(kernel.cubin.data(), 1, kernel.cubin.size(), file) == kernel.cubin.size());
    REQUIRE(std::fclose(file) == 0);
  }
  std::string sass;
  std::FILE* pipe = popen(("'" + cuobjdump.string() + "' -sass '" + cubin.string() + "'").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) sass.append(buffer, n);
  REQUIRE(pclose(pipe) == 0);
  return sass;
}

// How often `what` occurs in sass[from, to).
inline int count_in(const std::string& sass, const std::string& what, std::size_t from, std::size_t to) {
  int count = 0;
  for (std::size_t at = sass.find(what, from); at < to; at = sass.find(what, at + 1)) ++count;
  return count;
}

}  // namespace attnplan::plan_testing
