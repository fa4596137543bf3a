#include "compiler/compiler.hpp"

#include <nvrtc.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attnplan::compiler {

namespace {

// The host side is C++20, and NVRTC 12.0+ accepts -std=c++20 (checked with NVRTC 13.0, whose default is
// C++17): the templates may use what the host code uses.
constexpr const char* kLanguageStandard = "-std=c++20";
constexpr const char* kArchOptionPrefix = "--gpu-architecture=";
constexpr const char* kPtxasVerbose = "--ptxas-options=-v";
constexpr const char* kNoDriverCache = "--no-cache";

[[noreturn]] void throw_nvrtc(const KernelSource& source, const char* call, nvrtcResult result) {
  throw Error(Stage::compile,
              fmt::format("{}: {} failed: {}", source.family, call, nvrtcGetErrorString(result)));
}

// One NVRTC program, destroyed on every path out (nvrtcDestroyProgram never throws).
class Program {
 public:
  Program(const KernelSource& source, const std::string& stub, const TemplateLibrary& templates) {
    std::vector<const char*> contents;
    std::vector<const char*> names;
    contents.reserve(templates.headers().size());
    names.reserve(templates.headers().size());
    for (const auto& [name, text] : templates.headers()) {
      names.push_back(name.c_str());
      contents.push_back(text.c_str());
    }
    // The program name shows up in diagnostics and, with -lineinfo, in the line table. It is derived from
    // the family, which the stub's first line also names, so the cache key (which hashes the stub) covers it.
    const std::string program_name = (source.family.empty() ? std::string("kernel") : source.family) + ".cu";
    const nvrtcResult result =
        nvrtcCreateProgram(&program_, stub.c_str(), program_name.c_str(), static_cast<int>(names.size()),
                           contents.data(), names.data());
    if (result != NVRTC_SUCCESS) throw_nvrtc(source, "nvrtcCreateProgram", result);
  }
  ~Program() {
    if (program_ != nullptr) nvrtcDestroyProgram(&program_);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  nvrtcProgram get() const { return program_; }

 private:
  nvrtcProgram program_ = nullptr;
};

std::string program_log(const KernelSource& source, const Program& program) {
  std::size_t size = 0;
  nvrtcResult result = nvrtcGetProgramLogSize(program.get(), &size);
  if (result != NVRTC_SUCCESS) throw_nvrtc(source, "nvrtcGetProgramLogSize", result);
  std::string log(size, '\0');
  result = nvrtcGetProgramLog(program.get(), log.data());
  if (result != NVRTC_SUCCESS) throw_nvrtc(source, "nvrtcGetProgramLog", result);
  while (!log.empty() && log.back() == '\0') log.pop_back();  // the size counts the terminator
  return log;
}

std::vector<std::string> error_lines(const std::string& log) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < log.size()) {
    std::size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    std::string line = log.substr(start, end - start);
    // "rmsnorm.cu(3): error: ..." and "...: catastrophic error: ...", but not the closing summary
    // "1 error detected in the compilation of ...".
    if (line.find("error:") != std::string::npos) lines.push_back(std::move(line));
    start = end + 1;
  }
  return lines;
}

[[noreturn]] void throw_compile_failure(const KernelSource& source, const CompileOptions& options,
                                        const std::vector<std::string>& option_list, const std::string& stub,
                                        const std::string& log, nvrtcResult result) {
  std::string payload = log;
  payload += "\n--- options ---\n";
  for (const std::string& option : option_list) payload += option + "\n";
  payload += "--- stub ---\n" + stub;
  // replace: a spec string with invalid UTF-8 must not turn a compile error into a JSON exception.
  payload +=
      "--- spec ---\n" + source.spec.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::string message =
      fmt::format("{}: NVRTC compilation failed for {}", source.family, real_arch_name(options.arch));
  if (result != NVRTC_ERROR_COMPILATION) message += fmt::format(" ({})", nvrtcGetErrorString(result));
  throw Error(Stage::compile, std::move(message), std::move(payload), error_lines(log));
}

std::vector<const char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<const char*> pointers;
  pointers.reserve(strings.size());
  for (const std::string& text : strings) pointers.push_back(text.c_str());
  return pointers;
}

// Compiles `stub` with `option_list`; on failure throws with the full payload. Returns the log.
std::string compile_program(const Program& program, const KernelSource& source, const CompileOptions& options,
                            const std::vector<std::string>& option_list, const std::string& stub) {
  const std::vector<const char*> argv = c_strings(option_list);
  const nvrtcResult result = nvrtcCompileProgram(program.get(), static_cast<int>(argv.size()), argv.data());
  std::string log = program_log(source, program);
  if (result != NVRTC_SUCCESS) throw_compile_failure(source, options, option_list, stub, log, result);
  return log;
}

// The PTX of a compiled program, or nullopt when this NVRTC keeps none after a real-arch compile.
std::optional<std::string> program_ptx(const Program& program) {
  std::size_t size = 0;
  if (nvrtcGetPTXSize(program.get(), &size) != NVRTC_SUCCESS || size <= 1) return std::nullopt;
  std::string ptx(size, '\0');
  if (nvrtcGetPTX(program.get(), ptx.data()) != NVRTC_SUCCESS) return std::nullopt;
  while (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
  return ptx;
}

}  // namespace

std::string real_arch_name(const config::Arch& arch) {
  return arch.name();
}

std::string virtual_arch_name(const config::Arch& arch) {
  return "compute_" + arch.name().substr(3);  // "sm_90a" -> "compute_90a"
}

std::vector<std::string> CompileOptions::nvrtc_options(const Toolkit& toolkit) const {
  // A real architecture makes NVRTC run ptxas and return a cubin (and the -v resource report).
  std::vector<std::string> list{
      kArchOptionPrefix + real_arch_name(arch), kLanguageStandard,
      // Unannotated helpers in the templates are device code; there is no host pass.
      "-default-device", kPtxasVerbose,
      // NVRTC otherwise consults the driver's compute cache when a driver is present, and on a hit skips
      // ptxas entirely: no resource report, and a compile time that measures a cache read. attnplan's own
      // cache already keeps every cubin, so NVRTC always compiles for real.
      kNoDriverCache};
  if (line_info) list.emplace_back("-lineinfo");
  for (const auto& dir : toolkit.include_dirs) list.push_back("-I" + dir.string());
  list.insert(list.end(), extra.begin(), extra.end());
  return list;
}

Compiler::Compiler(Toolkit toolkit, TemplateLibrary templates)
    : toolkit_(std::move(toolkit)), templates_(std::move(templates)) {}

CompiledKernel Compiler::compile(const KernelSource& source, const CompileOptions& options) const {
  const auto start = std::chrono::steady_clock::now();
  const std::string stub = source.render_stub();
  const std::string name_expression = source.name_expression();

  CompiledKernel kernel;
  kernel.options = options.nvrtc_options(toolkit_);

  Program program(source, stub, templates_);
  nvrtcResult result = nvrtcAddNameExpression(program.get(), name_expression.c_str());
  if (result != NVRTC_SUCCESS) throw_nvrtc(source, "nvrtcAddNameExpression", result);
  kernel.log = compile_program(program, source, options, kernel.options, stub);

  const char* lowered = nullptr;
  result = nvrtcGetLoweredName(program.get(), name_expression.c_str(), &lowered);
  if (result != NVRTC_SUCCESS || lowered == nullptr) throw_nvrtc(source, "nvrtcGetLoweredName", result);
  kernel.lowered_name = lowered;  // owned by the program: copy before it is destroyed

  std::size_t cubin_size = 0;
  result = nvrtcGetCUBINSize(program.get(), &cubin_size);
  if (result != NVRTC_SUCCESS) throw_nvrtc(source, "nvrtcGetCUBINSize", result);
  if (cubin_size == 0) {
    throw Error(
        Stage::compile,
        fmt::format("{}: NVRTC returned no cubin for {}", source.family, real_arch_name(options.arch)),
        kernel.log);
  }
  kernel.cubin.resize(cubin_size);
  result = nvrtcGetCUBIN(program.get(), reinterpret_cast<char*>(kernel.cubin.data()));
  if (result != NVRTC_SUCCESS) throw_nvrtc(source, "nvrtcGetCUBIN", result);

  if (options.keep_ptx) {
    // NVRTC 13 keeps the PTX of a real-arch compile. Should one not, compile again for the virtual
    // architecture, which yields PTX only; ptxas does not run there, so its report is not asked for.
    if (auto ptx = program_ptx(program)) {
      kernel.ptx = std::move(*ptx);
    } else {
      std::vector<std::string> ptx_options;
      for (const std::string& option : kernel.options) {
        if (option.rfind(kArchOptionPrefix, 0) == 0) {
          ptx_options.push_back(kArchOptionPrefix + virtual_arch_name(options.arch));
        } else if (option != kPtxasVerbose) {
          ptx_options.push_back(option);
        }
      }
      Program ptx_program(source, stub, templates_);
      compile_program(ptx_program, source, options, ptx_options, stub);
      auto virtual_ptx = program_ptx(ptx_program);
      if (!virtual_ptx) {
        throw Error(Stage::compile, fmt::format("{}: NVRTC returned no PTX for {}", source.family,
                                                virtual_arch_name(options.arch)));
      }
      kernel.ptx = std::move(*virtual_ptx);
    }
  }

  kernel.resources = parse_ptxas_report(kernel.log, kernel.lowered_name);
  kernel.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return kernel;
}

}  // namespace attnplan::compiler
