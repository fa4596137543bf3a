// Real NVRTC compiles of the kernel templates: no GPU needed.
#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "compiler/compiler.hpp"
#include "core/error.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"
#include "test_kernels.hpp"

using attnplan::Error;
using attnplan::Stage;
using attnplan::compiler::CompiledKernel;
using attnplan::compiler::CompileOptions;
using attnplan::compiler::KernelSource;
using attnplan::testing::kSm80;
using attnplan::testing::kSm90a;
using attnplan::testing::test_compiler;

namespace {

void check_kernel(const CompiledKernel& kernel, bool with_ptx = false) {
  INFO(kernel.log);
  REQUIRE(kernel.cubin.size() > 4);
  CHECK(kernel.cubin[0] == 0x7f);
  CHECK(kernel.cubin[1] == 'E');
  CHECK(kernel.cubin[2] == 'L');
  CHECK(kernel.cubin[3] == 'F');
  CHECK(kernel.lowered_name.rfind("_Z", 0) == 0);
  CHECK(kernel.resources.registers > 0);
  CHECK(kernel.resources.spill_bytes() == 0);
  CHECK(kernel.ptx.empty() == !with_ptx);
  CHECK(kernel.compile_ms > 0);
}

KernelSource broken_source() {
  KernelSource source;
  source.family = "broken";
  source.header = "attnplan/broken.cuh";
  source.traits = "attnplan::kernels::BrokenTraits";
  source.kernel = "attnplan::kernels::broken_kernel";
  source.arguments = {{"width", "7"}};
  source.spec = {{"kind", "broken"}, {"width", 7}};
  return source;
}

attnplan::compiler::Compiler compiler_over(const attnplan::testing::TempDir& dir,
                                           const std::string& header_text) {
  std::filesystem::create_directories(dir / "attnplan");
  std::ofstream(dir / "attnplan/broken.cuh") << header_text;
  return {attnplan::testing::test_toolkit(), attnplan::compiler::TemplateLibrary::from_directory(dir.path())};
}

}  // namespace

TEST_CASE("rmsnorm compiles for sm_80 and sm_90a", "[compile][nvrtc]") {
  const auto arch = GENERATE(kSm80, kSm90a);
  for (const bool unit_offset : {false, true}) {
    const auto source = attnplan::testing::rmsnorm_source(4096, 256, unit_offset);
    const CompiledKernel kernel = test_compiler().compile(source, CompileOptions{arch});
    check_kernel(kernel);
    CHECK(kernel.lowered_name.find("rmsnorm_kernel") != std::string::npos);
    CHECK(kernel.resources.barriers >= 1);  // block_sum over 8 warps synchronizes
    CHECK(kernel.log.find(fmt::format("for '{}'", arch.name())) != std::string::npos);
  }
}

TEST_CASE("kv_store compiles for sm_80 and sm_90a, common and odd shapes", "[compile][nvrtc]") {
  const auto arch = GENERATE(kSm80, kSm90a);
  for (const auto& source : {attnplan::testing::kv_store_source(8, 128, 128, 16, 256, 4),
                             attnplan::testing::kv_store_source(1, 80, 64, 32, 128, 1)}) {
    INFO(source.render_stub());
    const CompiledKernel kernel = test_compiler().compile(source, CompileOptions{arch});
    check_kernel(kernel);
    CHECK(kernel.lowered_name.find("kv_store_kernel") != std::string::npos);
  }
}

TEST_CASE("the compiled cubin is a deterministic function of the inputs", "[compile][nvrtc]") {
  const auto source = attnplan::testing::kv_store_source(8, 128, 128, 16, 256, 4);
  const CompiledKernel first = test_compiler().compile(source, CompileOptions{kSm90a});
  const CompiledKernel second = test_compiler().compile(source, CompileOptions{kSm90a});
  CHECK(first.cubin == second.cubin);
  CHECK(first.lowered_name == second.lowered_name);
  CHECK(first.resources == second.resources);
}

TEST_CASE("keep_ptx also returns the PTX of the kernel", "[compile][nvrtc]") {
  CompileOptions options{kSm90a};
  options.keep_ptx = true;
  const CompiledKernel kernel =
      test_compiler().compile(attnplan::testing::rmsnorm_source(2048, 128, false), options);
  check_kernel(kernel, /*with_ptx=*/true);
  CHECK(kernel.ptx.find(".target sm_90a") != std::string::npos);
  CHECK(kernel.ptx.find(".entry " + kernel.lowered_name) != std::string::npos);
  CHECK(kernel.ptx.back() != '\0');
}

TEST_CASE("the option list is deterministic and complete", "[compile]") {
  const auto& toolkit = attnplan::testing::test_toolkit();
  CompileOptions options{kSm90a};
  options.extra = {"-DATTNPLAN_TEST=1"};
  std::vector<std::string> expected{"--gpu-architecture=sm_90a", "-std=c++20", "-default-device",
                                    "--ptxas-options=-v",        "--no-cache", "-lineinfo"};
  for (const auto& dir : toolkit.include_dirs) expected.push_back("-I" + dir.string());
  expected.push_back("-DATTNPLAN_TEST=1");
  CHECK(options.nvrtc_options(toolkit) == expected);

  options.line_info = false;
  options.arch = kSm80;
  const auto without_line_info = options.nvrtc_options(toolkit);
  CHECK(without_line_info.front() == "--gpu-architecture=sm_80");
  CHECK(std::find(without_line_info.begin(), without_line_info.end(), "-lineinfo") ==
        without_line_info.end());
  CHECK(attnplan::compiler::virtual_arch_name(kSm90a) == "compute_90a");
  CHECK(attnplan::compiler::real_arch_name(kSm80) == "sm_80");
}

TEST_CASE("a syntax error is a compile error carrying the log, the options, the stub and the spec",
          "[compile][nvrtc]") {
  attnplan::testing::TempDir dir;
  const auto compiler =
      compiler_over(dir,
                    "#pragma once\n"
                    "namespace attnplan::kernels {\n"
                    "template <int kWidth> struct BrokenTraits { using Params = int; };\n"
                    "template <class Traits> __global__ void broken_kernel(const int value) {\n"
                    "  int x = ;\n"
                    "}\n"
                    "}  // namespace attnplan::kernels\n");
  const KernelSource source = broken_source();
  try {
    compiler.compile(source, CompileOptions{kSm80});
    FAIL("expected an error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::compile);
    CHECK(error.message() == "broken: NVRTC compilation failed for sm_80");
    const std::string& payload = error.payload();
    CHECK(payload.find("attnplan/broken.cuh(5): error: expected an expression") != std::string::npos);
    CHECK(payload.find("--- options ---\n--gpu-architecture=sm_80\n") != std::string::npos);
    CHECK(payload.find("--- stub ---\n" + source.render_stub()) != std::string::npos);
    CHECK(payload.find("\"width\": 7") != std::string::npos);
    REQUIRE_FALSE(error.details().empty());
    CHECK(error.details().front().find("expected an expression") != std::string::npos);
  }
}

TEST_CASE("a failed static_assert names the broken precondition", "[compile][nvrtc]") {
  // vectors_per_thread = 16384 / 8 / 32 = 64 > 16: the row does not fit in registers.
  const auto source = attnplan::testing::rmsnorm_source(16384, 32, false);
  try {
    test_compiler().compile(source, CompileOptions{kSm90a});
    FAIL("expected an error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::compile);
    CHECK(error.payload().find("a row must fit in registers") != std::string::npos);
  }
}

TEST_CASE("an option NVRTC rejects is a compile error too", "[compile][nvrtc]") {
  CompileOptions options{kSm80};
  options.extra = {"--no-such-option"};
  try {
    test_compiler().compile(attnplan::testing::rmsnorm_source(1024, 128, false), options);
    FAIL("expected an error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::compile);
    CHECK(error.message().find("NVRTC_ERROR_INVALID_OPTION") != std::string::npos);
    CHECK(error.payload().find("--no-such-option") != std::string::npos);
  }
}

TEST_CASE("a header missing from the library is reported by NVRTC", "[compile][nvrtc]") {
  KernelSource source = attnplan::testing::rmsnorm_source(1024, 128, false);
  source.header = "attnplan/missing.cuh";
  try {
    test_compiler().compile(source, CompileOptions{kSm80});
    FAIL("expected an error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::compile);
    CHECK(error.payload().find("attnplan/missing.cuh") != std::string::npos);
  }
}

// Prints the ptxas numbers of the reference specializations: `test_compiler "[report]"`.
TEST_CASE("ptxas report of the reference specializations", "[.][report]") {
  for (const auto arch : {kSm80, kSm90a}) {
    for (const auto& source : {attnplan::testing::rmsnorm_source(4096, 256, false),
                               attnplan::testing::kv_store_source(8, 128, 128, 16, 256, 4),
                               attnplan::testing::kv_store_source(1, 80, 64, 32, 128, 1)}) {
      const CompiledKernel kernel = test_compiler().compile(source, CompileOptions{arch});
      const auto& r = kernel.resources;
      fmt::print(
          "{:7} {:9} {:28} regs={:3} barriers={} smem={:4} stack={} spill_st={} spill_ld={} cmem={:4} "
          "cubin={:6}B {:.0f}ms\n",
          arch.name(), source.family, source.spec.dump(), r.registers, r.barriers, r.shared_bytes,
          r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes, r.constant_bytes, kernel.cubin.size(),
          kernel.compile_ms);
    }
  }
}
