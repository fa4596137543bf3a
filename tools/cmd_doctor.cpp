// attnplan doctor: what this machine offers attnplan (toolkit headers, NVRTC, templates, driver and
// device, cache directory), gathered into one JSON report and printed as a table or as the JSON itself.
// The report is built first and rendered second, so that both outputs always say the same thing.
#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "cache/cubin_cache.hpp"
#include "commands.hpp"
#include "compiler/template_library.hpp"
#include "compiler/toolkit.hpp"
#include "core/error.hpp"
#include "driver/cuda_api.hpp"
#include "driver/device.hpp"
#include "runtime_setup.hpp"

namespace attnplan::cli {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// cuDriverGetVersion's 1000 * major + 10 * minor as "13.0".
std::string driver_version_name(int version) {
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

std::string human_bytes(std::uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / (1ull << 10));
  return fmt::format("{} B", bytes);
}

Json error_json(const Error& error) {
  Json out = {{"error", error.message()}};
  if (!error.details().empty()) out["details"] = error.details();
  return out;
}

// The toolkit exactly as the compiler would find it, or the error Toolkit::locate gives.
Json toolkit_report(const RuntimeOptions& options, std::vector<std::string>& problems) {
  try {
    const compiler::Toolkit toolkit =
        compiler::Toolkit::locate(options.cuda_root, options.cuda_home, options.cuda_path);
    const fs::path include_dir = toolkit.root / "include";
    Json out = {{"found", true}, {"root", toolkit.root.string()}, {"include_dirs", Json::array()}};
    for (const fs::path& dir : toolkit.include_dirs) out["include_dirs"].push_back(dir.string());
    out["header_version"] = toolkit.header_version;
    std::error_code ignored;
    out["cuda_bf16_h"] = fs::exists(include_dir / "cuda_bf16.h", ignored);
    out["cccl"] = fs::is_directory(include_dir / "cccl", ignored);
    // CUDA 13 moved CCCL under include/cccl and cuda_bf16.h includes from it; CUDA 12 has it inline.
    int header_major = 0;
    std::sscanf(toolkit.header_version.c_str(), "%d", &header_major);  // "unknown" leaves 0
    const bool cccl_needed = header_major >= 13;
    out["cccl_needed"] = cccl_needed;
    if (cccl_needed && !out["cccl"].get<bool>()) {
      problems.push_back(fmt::format("{}/cccl is missing; CUDA {} headers need it", include_dir.string(),
                                     toolkit.header_version));
    }
    return out;
  } catch (const Error& error) {
    problems.push_back("CUDA toolkit headers not found: " + error.message());
    Json out = {{"found", false}, {"cuda_bf16_h", false}, {"cccl", false}};
    out.update(error_json(error));
    return out;
  }
}

Json nvrtc_report(std::vector<std::string>& problems) {
  try {
    Json out = {{"version", compiler::nvrtc_version().str()}};
    const std::optional<fs::path> library = compiler::loaded_nvrtc_library();
    out["library"] = library ? Json(library->string()) : Json(nullptr);
    return out;
  } catch (const Error& error) {
    problems.push_back("NVRTC does not work: " + error.message());
    return error_json(error);
  }
}

Json templates_report(const RuntimeOptions& options, std::vector<std::string>& problems) {
  try {
    const compiler::TemplateLibrary templates =
        options.template_dir ? compiler::TemplateLibrary::from_directory(*options.template_dir)
                             : compiler::TemplateLibrary::embedded();
    return {{"origin", options.template_dir ? "ATTNPLAN_TEMPLATE_DIR" : "embedded"},
            {"directory", options.template_dir ? Json(options.template_dir->string()) : Json(nullptr)},
            {"headers", templates.headers().size()}};
  } catch (const Error& error) {
    problems.push_back("templates unreadable: " + error.message());
    Json out = {{"origin", "ATTNPLAN_TEMPLATE_DIR"}, {"directory", options.template_dir->string()}};
    out.update(error_json(error));
    return out;
  }
}

// A missing driver or device is reported, never counted as a problem: compiling needs neither.
Json driver_report(const RuntimeOptions& options) {
  Json out;
  try {
    // api() alone opens libcuda without cuInit, which tells "no driver" apart from "driver, no device".
    const driver::CudaApi& cuda = driver::api();
    int version = 0;
    out["loaded"] = true;
    if (cuda.cuDriverGetVersion(&version) == CUDA_SUCCESS) out["version"] = driver_version_name(version);
  } catch (const Error& error) {
    return {
        {"loaded", false}, {"available", false}, {"status", "no CUDA driver"}, {"reason", error.message()}};
  }
  std::string reason;
  if (!driver::device_available(&reason)) {
    out["available"] = false;
    out["status"] = "no usable device";
    out["reason"] = reason;
    return out;
  }
  try {
    const driver::DeviceInfo device = driver::query_device(options.device);
    out["available"] = true;
    out["status"] = "ok";
    out["version"] = driver_version_name(device.driver_version);
    out["device"] = {{"ordinal", device.ordinal},
                     {"name", device.name},
                     {"arch", device.arch_name()},
                     {"multiprocessors", device.multiprocessors},
                     {"memory_bytes", device.total_memory}};
  } catch (const Error& error) {
    out["available"] = false;
    out["status"] = fmt::format("device {} unusable", options.device);
    out["reason"] = error.message();
  }
  return out;
}

// The nearest existing directory at or above `path`: where a cache that does not exist yet would be
// created, hence what decides its writability and free space.
fs::path nearest_existing(fs::path path) {
  std::error_code ignored;
  path = fs::absolute(path, ignored);
  while (!fs::exists(path, ignored) && path.has_parent_path() && path != path.parent_path()) {
    path = path.parent_path();
  }
  return path;
}

// Looks without creating anything: a cache directory that does not exist yet is reported as such, with
// the writability of the directory it would be created in.
Json cache_report(const RuntimeOptions& options, std::vector<std::string>& warnings) {
  Json out = {{"directory", options.cache_dir.string()}, {"max_bytes", options.cache_max_bytes}};
  if (options.cache_dir.empty()) {
    out["exists"] = false;
    out["writable"] = false;
    warnings.push_back("no cache directory (set ATTNPLAN_CACHE_DIR or HOME); kernels compile in memory");
    return out;
  }
  std::error_code ignored;
  const bool exists = fs::is_directory(options.cache_dir, ignored);
  out["exists"] = exists;
  const fs::path existing = nearest_existing(options.cache_dir);
  struct statvfs stats {};
  if (statvfs(existing.c_str(), &stats) == 0) {
    out["free_bytes"] = static_cast<std::uint64_t>(stats.f_bavail) * stats.f_frsize;
  } else {
    out["free_bytes"] = nullptr;
  }
  std::uint64_t entries = 0;
  std::uint64_t total = 0;
  if (exists) {
    try {
      cache::CubinCache cache(cache::CacheOptions{options.cache_dir, options.cache_max_bytes},
                              [&warnings](const std::string& message) { warnings.push_back(message); });
      out["writable"] = cache.writable();
      for (const cache::EntryInfo& info : cache.list()) {
        ++entries;
        total += info.bytes;
      }
    } catch (const Error& error) {
      out["writable"] = false;
      warnings.push_back("cache unreadable: " + error.message());
    }
  } else {
    out["writable"] = fs::is_directory(existing, ignored) && access(existing.c_str(), W_OK | X_OK) == 0;
    // An existing cache says so itself, through the CubinCache warning sink above.
    if (!out["writable"].get<bool>()) {
      warnings.push_back(fmt::format("{} cannot be created; kernels would compile in memory only",
                                     options.cache_dir.string()));
    }
  }
  out["entries"] = entries;
  out["total_bytes"] = total;
  return out;
}

Json gather(const RuntimeOptions& options) {
  std::vector<std::string> problems;
  std::vector<std::string> warnings;
  Json report;
  report["toolkit"] = toolkit_report(options, problems);
  report["nvrtc"] = nvrtc_report(problems);
  report["templates"] = templates_report(options, problems);
  report["driver"] = driver_report(options);
  report["cache"] = cache_report(options, warnings);
  report["ok"] = problems.empty();
  report["problems"] = problems;
  report["warnings"] = warnings;
  return report;
}

void row(const std::string& name, const std::string& value) {
  fmt::print("{:<16}{}\n", name, value);
}

std::string yes_no(const Json& value) {
  return value.is_boolean() && value.get<bool>() ? "yes" : "no";
}

void print_table(const Json& report) {
  const Json& toolkit = report["toolkit"];
  if (toolkit["found"].get<bool>()) {
    row("toolkit", fmt::format("{} (CUDA {} headers)", toolkit["root"].get<std::string>(),
                               toolkit["header_version"].get<std::string>()));
    for (const Json& dir : toolkit["include_dirs"]) row("  include", dir.get<std::string>());
  } else {
    row("toolkit", "not found: " + toolkit["error"].get<std::string>());
    for (const Json& detail : toolkit.value("details", Json::array())) row("", detail.get<std::string>());
  }
  row("  cuda_bf16.h", toolkit["cuda_bf16_h"].get<bool>() ? "found" : "missing");
  row("  cccl", toolkit["cccl"].get<bool>()           ? "found"
                : toolkit.value("cccl_needed", false) ? "missing"
                                                      : "not present (needed from CUDA 13 on)");

  const Json& nvrtc = report["nvrtc"];
  if (nvrtc.contains("error")) {
    row("nvrtc", "error: " + nvrtc["error"].get<std::string>());
  } else {
    row("nvrtc", nvrtc["version"].get<std::string>() +
                     (nvrtc["library"].is_string() ? " (" + nvrtc["library"].get<std::string>() + ")" : ""));
  }

  const Json& templates = report["templates"];
  if (templates.contains("error")) {
    row("templates", "error: " + templates["error"].get<std::string>());
  } else {
    row("templates",
        templates["origin"] == "embedded"
            ? fmt::format("embedded ({} headers)", templates["headers"].get<std::size_t>())
            : fmt::format("ATTNPLAN_TEMPLATE_DIR {} ({} headers)", templates["directory"].get<std::string>(),
                          templates["headers"].get<std::size_t>()));
  }

  const Json& driver = report["driver"];
  if (driver["available"].get<bool>()) {
    const Json& device = driver["device"];
    row("driver", "CUDA " + driver["version"].get<std::string>());
    row("device", fmt::format("{}: {} ({}), {} SMs, {}", device["ordinal"].get<int>(),
                              device["name"].get<std::string>(), device["arch"].get<std::string>(),
                              device["multiprocessors"].get<int>(),
                              human_bytes(device["memory_bytes"].get<std::uint64_t>())));
  } else {
    row("driver",
        driver["status"].get<std::string>() +
            (driver.contains("version") ? " (CUDA " + driver["version"].get<std::string>() + ")" : ""));
    row("  reason", driver["reason"].get<std::string>());
    row("device", "none (compiling needs none; auto arch means sm_90a)");
  }

  const Json& cache = report["cache"];
  row("cache",
      cache["directory"].get<std::string>() + (cache["exists"].get<bool>() ? "" : " (not created yet)"));
  row("  writable", yes_no(cache["writable"]));
  if (cache.contains("free_bytes") && cache["free_bytes"].is_number()) {
    row("  free disk", human_bytes(cache["free_bytes"].get<std::uint64_t>()));
  }
  row("  entries", fmt::format("{}, {}", cache["entries"].get<std::uint64_t>(),
                               human_bytes(cache["total_bytes"].get<std::uint64_t>())));
  const std::uint64_t cap = cache["max_bytes"].get<std::uint64_t>();
  row("  size cap", cap == 0 ? "none" : human_bytes(cap));

  fmt::print("\n");
  for (const Json& warning : report["warnings"]) fmt::print("warning: {}\n", warning.get<std::string>());
  for (const Json& problem : report["problems"]) fmt::print("problem: {}\n", problem.get<std::string>());
  fmt::print("{}\n", report["ok"].get<bool>() ? "ok: this machine can compile plans"
                                              : "not ok: compiling would fail here");
}

}  // namespace

Command doctor_command() {
  Command command;
  command.name = "doctor";
  command.synopsis = "doctor [--cache-dir D] [--cuda-root R] [--json]";
  command.description =
      "Reports what attnplan finds on this machine: the CUDA toolkit headers and NVRTC it compiles with,\n"
      "where the templates come from, the driver and device (if any), and the cubin cache. Exits 0 when\n"
      "compiling works here (a missing GPU is fine: compile needs none), 2 when it would fail.";
  command.options = {
      kCacheDirOption,
      {"--cuda-root", "R", "check this toolkit root instead of searching (as RuntimeOptions::cuda_root)"},
      {"--json", "", "print one JSON object instead of the table"},
  };
  command.run = [](const Arguments& args) {
    if (!args.positional().empty()) throw UsageError{"doctor takes no positional arguments"};
    RuntimeOptions options = runtime_options(args);
    if (auto root = args.value("--cuda-root")) options.cuda_root = fs::path(*root);
    const Json report = gather(options);
    if (args.flag("--json")) {
      fmt::print("{}\n", report.dump(2));
    } else {
      print_table(report);
    }
    return report["ok"].get<bool>() ? kExitOk : kExitFailure;
  };
  return command;
}

}  // namespace attnplan::cli
