#include "compiler/ptxas_report.hpp"
#include "core/error.hpp"
#include "support/catch.hpp"

using attnplan::compiler::parse_ptxas_report;
using attnplan::compiler::ResourceUsage;

namespace {

// Verbatim from NVRTC 13.0, sm_90a: no cmem on the "Used" line.
const std::string kNvrtc13Sm90a =
    "ptxas info    : 21 bytes gmem\n"
    "ptxas info    : Compiling entry function "
    "'_ZN8attnplan7kernels14rmsnorm_kernelINS0_13RmsNormTraitsILi4096ELi256ELb0EEEEEvNS_13RmsNormParamsE' "
    "for 'sm_90a'\n"
    "ptxas info    : Function properties for "
    "_ZN8attnplan7kernels14rmsnorm_kernelINS0_13RmsNormTraitsILi4096ELi256ELb0EEEEEvNS_13RmsNormParamsE\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 32 registers, used 1 barriers, 32 bytes smem\n"
    "ptxas info    : Compile time = 11.651 ms\n";
const std::string kRmsnorm =
    "_ZN8attnplan7kernels14rmsnorm_kernelINS0_13RmsNormTraitsILi4096ELi256ELb0EEEEEvNS_13RmsNormParamsE";

// Two kernels in one log; the second spills, and a non-inlined device function has its own
// "Function properties" block inside the first kernel's section.
const std::string kTwoKernels =
    "ptxas info    : 0 bytes gmem, 48 bytes cmem[4]\n"
    "ptxas info    : Function properties for _Z6helperi\n"
    "    24 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
    "ptxas info    : Compiling entry function '_Z5firstv' for 'sm_80'\n"
    "ptxas info    : Function properties for _Z5firstv\n"
    "    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Function properties for _Z6helperi\n"
    "    24 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
    "ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem, 380 bytes cmem[0], 8 bytes cmem[2]\n"
    "ptxas info    : Compiling entry function '_Z6secondv' for 'sm_80'\n"
    "ptxas info    : Function properties for _Z6secondv\n"
    "    96 bytes stack frame, 92 bytes spill stores, 88 bytes spill loads\n"
    "ptxas info    : Used 255 registers, used 0 barriers, 360 bytes cmem[0]\n";

}  // namespace

TEST_CASE("ptxas report of NVRTC 13 for sm_90a", "[ptxas]") {
  const ResourceUsage usage = parse_ptxas_report(kNvrtc13Sm90a, kRmsnorm);
  CHECK(usage.registers == 32);
  CHECK(usage.barriers == 1);
  CHECK(usage.shared_bytes == 32);
  CHECK(usage.constant_bytes == 0);
  CHECK(usage.stack_bytes == 0);
  CHECK(usage.spill_bytes() == 0);
}

TEST_CASE("ptxas report with several functions", "[ptxas]") {
  const ResourceUsage first = parse_ptxas_report(kTwoKernels, "_Z5firstv");
  CHECK(first.registers == 40);
  CHECK(first.barriers == 1);
  CHECK(first.shared_bytes == 128);
  CHECK(first.constant_bytes == 388);
  CHECK(first.stack_bytes == 16);  // not the helper's 24
  CHECK(first.spill_store_bytes == 0);
  CHECK(first.spill_load_bytes == 0);

  const ResourceUsage second = parse_ptxas_report(kTwoKernels, "_Z6secondv");
  CHECK(second.registers == 255);
  CHECK(second.barriers == 0);
  CHECK(second.shared_bytes == 0);  // no smem part on the line
  CHECK(second.constant_bytes == 360);
  CHECK(second.stack_bytes == 96);
  CHECK(second.spill_store_bytes == 92);
  CHECK(second.spill_load_bytes == 88);
  CHECK(second.spill_bytes() == 180);
}

TEST_CASE("ptxas report in the CUDA 11 format, without barriers", "[ptxas]") {
  const std::string log =
      "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_80'\n"
      "ptxas info    : Function properties for _Z1kPf\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 12 registers, 4096 bytes smem, 360 bytes cmem[0]\n";
  const ResourceUsage usage = parse_ptxas_report(log, "_Z1kPf");
  CHECK(usage.registers == 12);
  CHECK(usage.barriers == 0);
  CHECK(usage.shared_bytes == 4096);
  CHECK(usage.constant_bytes == 360);
}

TEST_CASE("a kernel missing from the ptxas report is an error", "[ptxas]") {
  try {
    parse_ptxas_report(kTwoKernels, "_Z5thirdv");
    FAIL("expected an error");
  } catch (const attnplan::Error& error) {
    CHECK(error.stage() == attnplan::Stage::compile);
    CHECK(error.message().find("_Z5thirdv") != std::string::npos);
    CHECK(error.payload() == kTwoKernels);
  }
  // A helper's properties alone do not make an entry.
  CHECK_THROWS_AS(parse_ptxas_report(kTwoKernels, "_Z6helperi"), attnplan::Error);
  CHECK_THROWS_AS(parse_ptxas_report("", "_Z5firstv"), attnplan::Error);
}

TEST_CASE("an entry without a register line is an error", "[ptxas]") {
  const std::string log = "ptxas info    : Compiling entry function '_Z1kv' for 'sm_80'\n";
  CHECK_THROWS_AS(parse_ptxas_report(log, "_Z1kv"), attnplan::Error);
}
