// NVRTC compile service: a KernelSource in, a cubin with its lowered symbol and ptxas resource
// report out. Needs no GPU and no driver.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/kernel_source.hpp"
#include "compiler/template_library.hpp"
#include "compiler/toolkit.hpp"
#include "config/target.hpp"

namespace attnplan::compiler {

struct CompileOptions {
  config::Arch arch;
  bool keep_ptx = false;   // also produce PTX (for `attnplan cache show --ptx`)
  bool line_info = true;   // -lineinfo: source lines in SASS and profilers, no speed cost
  std::vector<std::string> extra;  // appended verbatim to the NVRTC options

  // The exact NVRTC option list, in order; it is part of the cache key.
  std::vector<std::string> nvrtc_options(const Toolkit& toolkit) const;
};

// What ptxas reports for one kernel (parsed from the `--ptxas-options=-v` log).
struct ResourceUsage {
  int registers = 0;
  int shared_bytes = 0;        // static shared memory
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  int stack_bytes = 0;
  int constant_bytes = 0;
  int barriers = 0;
  int spill_bytes() const { return spill_store_bytes + spill_load_bytes; }
};

// Parses the ptxas info lines that concern `lowered_name`. Throws Error(compile) if absent.
ResourceUsage parse_ptxas_report(const std::string& log, const std::string& lowered_name);

struct CompiledKernel {
  std::string lowered_name;  // the mangled symbol, from nvrtcGetLoweredName
  std::vector<std::uint8_t> cubin;
  std::string ptx;           // empty unless CompileOptions::keep_ptx
  std::string log;           // the full NVRTC program log
  ResourceUsage resources;
  double compile_ms = 0;
};

class Compiler {
 public:
  Compiler(Toolkit toolkit, TemplateLibrary templates);

  // Throws Error(Stage::compile) whose payload holds the program log, the options and the stub.
  CompiledKernel compile(const KernelSource& source, const CompileOptions& options) const;

  const Toolkit& toolkit() const { return toolkit_; }
  const TemplateLibrary& templates() const { return templates_; }

 private:
  Toolkit toolkit_;
  TemplateLibrary templates_;
};

}  // namespace attnplan::compiler
