// NVRTC compile service: a KernelSource in, a cubin with its lowered symbol and ptxas resource
// report out. Needs no GPU and no driver.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/kernel_source.hpp"
#include "compiler/ptxas_report.hpp"
#include "compiler/template_library.hpp"
#include "compiler/toolkit.hpp"
#include "config/target.hpp"

namespace attnplan::compiler {

// "sm_90a", "sm_80", "sm_100a": the real architecture NVRTC compiles to a cubin for.
std::string real_arch_name(const config::Arch& arch);
// "compute_90a": the matching virtual architecture (PTX only).
std::string virtual_arch_name(const config::Arch& arch);

struct CompileOptions {
  config::Arch arch;
  bool keep_ptx = false;  // also produce PTX (for `attnplan cache show --ptx`); does not change the cubin
  bool line_info = true;  // -lineinfo: source lines in SASS and profilers, no speed cost
  std::vector<std::string> extra;  // appended verbatim to the NVRTC options

  // The exact NVRTC option list, in order; it is part of the cache key:
  //   --gpu-architecture=sm_90a -std=c++20 -default-device --ptxas-options=-v [-lineinfo]
  //   -I<toolkit include dir>... <extra>...
  // No fast-math flags: NVRTC's defaults (-ftz=false -prec-div=true -prec-sqrt=true -fmad=true) are what
  // the CPU reference is compared against.
  std::vector<std::string> nvrtc_options(const Toolkit& toolkit) const;
};

struct CompiledKernel {
  std::string lowered_name;  // the mangled symbol, from nvrtcGetLoweredName
  std::vector<std::uint8_t> cubin;
  std::string ptx;                   // empty unless CompileOptions::keep_ptx
  std::string log;                   // the full NVRTC program log (the ptxas report included)
  std::vector<std::string> options;  // what was passed to NVRTC
  ResourceUsage resources;
  double compile_ms = 0;  // wall time of NVRTC, steady clock
};

class Compiler {
 public:
  Compiler(Toolkit toolkit, TemplateLibrary templates);

  // Thread-safe: each call owns its NVRTC program, and NVRTC allows concurrent distinct programs.
  // Every template header is handed to NVRTC in memory under its include name, so no file system path
  // of templates/ is involved. Throws Error(Stage::compile) whose payload holds the program log, the
  // options, the stub and the spec; its details list the log's error lines.
  CompiledKernel compile(const KernelSource& source, const CompileOptions& options) const;

  const Toolkit& toolkit() const { return toolkit_; }
  const TemplateLibrary& templates() const { return templates_; }

 private:
  Toolkit toolkit_;
  TemplateLibrary templates_;
};

}  // namespace attnplan::compiler
