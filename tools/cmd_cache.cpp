#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/cubin_cache.hpp"
#include "commands.hpp"
#include "compiler/cache_key.hpp"
#include "config/parse.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "plan/runtime.hpp"
#include "plan/runtime_options.hpp"
#include "runtime_setup.hpp"

extern char** environ;

namespace attnplan::cli {

namespace {

cache::CubinCache open_cache(const RuntimeOptions& options) {
  return cache::CubinCache(
      cache::CacheOptions{options.cache_dir, options.cache_max_bytes},
      [](const std::string& message) { fmt::print(stderr, "attnplan: warning: {}\n", message); });
}

std::string human_bytes(std::uint64_t bytes) {
  if (bytes >= (1u << 20)) return fmt::format("{:.1f} MiB", bytes / double(1u << 20));
  if (bytes >= (1u << 10)) return fmt::format("{:.1f} KiB", bytes / double(1u << 10));
  return fmt::format("{} B", bytes);
}

// A full key, or a prefix that names exactly one entry.
std::string resolve_key(const cache::CubinCache& cache, const std::string& prefix) {
  std::vector<std::string> matches;
  for (const cache::EntryInfo& info : cache.list()) {
    if (info.key.rfind(prefix, 0) == 0) matches.push_back(info.key);
  }
  if (matches.empty()) throw Error(Stage::input, fmt::format("KEY {}: no cache entry has this key", prefix));
  if (matches.size() > 1) {
    throw Error(Stage::input, fmt::format("KEY {}: {} entries share this prefix; give more digits", prefix,
                                          matches.size()));
  }
  return matches.front();
}

// cuobjdump from the toolkit next to the CUDA_HOME / CUDA_PATH / default prefix, else nvdisasm, else PATH.
std::optional<std::filesystem::path> find_disassembler(const RuntimeOptions& options, bool* is_nvdisasm) {
  std::vector<std::filesystem::path> roots;
  if (options.cuda_home) roots.emplace_back(*options.cuda_home);
  if (options.cuda_path) roots.emplace_back(*options.cuda_path);
  roots.emplace_back("/usr/local/cuda");
  for (const char* tool : {"cuobjdump", "nvdisasm"}) {
    for (const auto& root : roots) {
      std::filesystem::path candidate = root / "bin" / tool;
      if (::access(candidate.c_str(), X_OK) == 0) {
        *is_nvdisasm = std::string(tool) == "nvdisasm";
        return candidate;
      }
    }
    if (const char* path = std::getenv("PATH")) {
      std::string dirs = path;
      std::size_t start = 0;
      while (start <= dirs.size()) {
        std::size_t end = dirs.find(':', start);
        if (end == std::string::npos) end = dirs.size();
        std::filesystem::path candidate = std::filesystem::path(dirs.substr(start, end - start)) / tool;
        if (end > start && ::access(candidate.c_str(), X_OK) == 0) {
          *is_nvdisasm = std::string(tool) == "nvdisasm";
          return candidate;
        }
        start = end + 1;
      }
    }
  }
  return std::nullopt;
}

int run_program(const std::vector<std::string>& argv) {
  std::vector<char*> raw;
  for (const std::string& arg : argv) raw.push_back(const_cast<char*>(arg.c_str()));
  raw.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, raw[0], nullptr, nullptr, raw.data(), environ) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int show(const Arguments& args, const RuntimeOptions& options) {
  cache::CubinCache cache = open_cache(options);
  if (args.positional().size() != 2) throw UsageError{"cache show needs exactly one KEY"};
  const std::string key = resolve_key(cache, args.positional()[1]);
  std::shared_ptr<const cache::Entry> entry = cache.find(key);
  if (!entry) throw Error(Stage::cache, fmt::format("entry {} is damaged and was moved to quarantine", key));

  if (std::optional<std::string> file = args.value("--cubin")) {
    // The entry's bytes, hash-checked by find(), for tools that take a cubin file (nvdisasm, ncu's
    // --import-source, tools/sass.py); written whole or not at all.
    try {
      core::write_file_atomic(*file, entry->cubin.data(), entry->cubin.size());
    } catch (const Error& error) {  // the user's path, not the cache: bad input
      throw Error(Stage::input, fmt::format("--cubin {}: {}", *file, error.message()));
    }
    fmt::print("{}\n", *file);
  } else if (args.flag("--manifest")) {
    fmt::print("{}\n", entry->manifest.dump(2));
  } else if (args.flag("--ptx")) {
    std::optional<std::string> ptx = cache.ptx(key);
    if (!ptx) {
      fmt::print(stderr, "no PTX stored for {}; rebuild it with 'attnplan compile CONFIG --keep-ptx'\n", key);
      return kExitBadInput;
    }
    fmt::print("{}", *ptx);
  } else if (args.flag("--sass")) {
    bool nvdisasm = false;
    std::optional<std::filesystem::path> tool = find_disassembler(options, &nvdisasm);
    if (!tool) {
      fmt::print(
          stderr,
          "no SASS disassembler found: neither cuobjdump nor nvdisasm is in $CUDA_HOME/bin, $CUDA_PATH/bin, "
          "/usr/local/cuda/bin or PATH (install the CUDA toolkit's cuobjdump)\n");
      return kExitFailure;
    }
    std::filesystem::path temp = std::filesystem::temp_directory_path() /
                                 fmt::format("attnplan-{}-{}.cubin", key.substr(0, 16), ::getpid());
    {
      std::ofstream out(temp, std::ios::binary);
      out.write(reinterpret_cast<const char*>(entry->cubin.data()), std::streamsize(entry->cubin.size()));
    }
    fmt::print(stderr, "disassembling with {}\n", tool->string());
    std::fflush(stdout);
    const int status = nvdisasm ? run_program({tool->string(), temp.string()})
                                : run_program({tool->string(), "--dump-sass", temp.string()});
    std::filesystem::remove(temp);
    return status == 0 ? kExitOk : kExitFailure;
  } else {
    const nlohmann::json& m = entry->manifest;
    fmt::print("key        {}\n", key);
    fmt::print("kernel     {} ({})\n", m.value("name", "?"), m.value("lowered_name", "?"));
    fmt::print("arch       {}   nvrtc {}\n", m.value("arch", "?"), m.value("nvrtc_version", "?"));
    fmt::print("cubin      {} ({}), sha256 {}\n", human_bytes(entry->cubin.size()), entry->cubin.size(),
               m.value("cubin_sha256", "?"));
    fmt::print("created    {}\n", m.value("created", "?"));
    fmt::print("compile    {:.1f} ms\n", m.value("compile_ms", 0.0));
    if (m.contains("resources")) fmt::print("resources  {}\n", m["resources"].dump());
    if (m.contains("spec")) fmt::print("spec       {}\n", m["spec"].dump());
    if (m.contains("options")) fmt::print("options    {}\n", m["options"].dump());
    if (m.contains("stub")) fmt::print("stub\n{}", m["stub"].get<std::string>());
  }
  return kExitOk;
}

int list(const RuntimeOptions& options) {
  cache::CubinCache cache = open_cache(options);
  std::vector<cache::EntryInfo> entries = cache.list();
  std::uint64_t total = 0;
  fmt::print("{:<16} {:<16} {:<8} {:>10}  {}\n", "key", "kernel", "arch", "size", "spec");
  for (const cache::EntryInfo& info : entries) {
    total += info.bytes;
    const nlohmann::json& m = info.manifest;
    fmt::print("{:<16} {:<16} {:<8} {:>10}  {}\n", info.key.substr(0, 16), m.value("name", "?"),
               m.value("arch", "?"), human_bytes(info.bytes), m.contains("spec") ? m["spec"].dump() : "");
  }
  fmt::print("\n{} entries, {} in {}\n", entries.size(), human_bytes(total),
             cache.entries_directory().string());
  return kExitOk;
}

int verify(const RuntimeOptions& options) {
  cache::CubinCache cache = open_cache(options);
  cache::VerifyReport report = cache.verify();
  for (const std::string& problem : report.problems) fmt::print("bad: {}\n", problem);
  fmt::print("{} entries checked, {} problems\n", report.checked, report.problems.size());
  return report.problems.empty() ? kExitOk : kExitBadInput;
}

// The entry of the same kernel (name and family) whose recorded key inputs differ from `wanted` in the
// fewest fields, with those differences; nullopt when the cache holds no usable entry of this kernel.
struct Nearest {
  const cache::EntryInfo* entry = nullptr;
  std::vector<std::string> differences;
};
std::optional<Nearest> nearest_entry(const std::vector<cache::EntryInfo>& entries, const PlannedKey& wanted) {
  std::optional<Nearest> best;
  for (const cache::EntryInfo& info : entries) {
    const nlohmann::json& manifest = info.manifest;
    if (!manifest.is_object() || manifest.value("name", "") != wanted.name ||
        manifest.value("family", "") != wanted.family || !manifest.contains("key_inputs")) {
      continue;
    }
    compiler::KeyInputs cached;
    try {
      cached = compiler::KeyInputs::from_json(manifest["key_inputs"]);
    } catch (const Error&) {
      continue;  // written by another attnplan version: nothing to compare field by field
    }
    std::vector<std::string> differences = compiler::key_differences(cached, wanted.inputs);
    if (!best || differences.size() < best->differences.size()) best = Nearest{&info, std::move(differences)};
  }
  return best;
}

// Where one kernel of the plan would come from: a directory (hit or prebuilt), or a miss with the nearest
// entry of the same kernel, if any.
struct Explained {
  const PlannedKey* planned = nullptr;
  std::string cache;                          // "hit", "prebuilt" or "miss"
  std::optional<std::filesystem::path> root;  // hit / prebuilt: the directory it would be read from
  std::optional<Nearest> nearest;             // miss
};

void print_explained_table(const std::vector<Explained>& kernels) {
  fmt::print("\n{:<18} {:<12} {:<8} {}\n", "kernel", "key", "cache", "why");
  for (const Explained& kernel : kernels) {
    const PlannedKey& planned = *kernel.planned;
    const std::string prefix = fmt::format("{:<18} {:<12} ", planned.name, planned.key.substr(0, 12));
    if (kernel.root) {
      fmt::print("{}{:<8} in {}\n", prefix, kernel.cache, kernel.root->string());
    } else if (!kernel.nearest) {
      fmt::print("{}{:<8} no entry of this kernel in the cache\n", prefix, "miss");
    } else if (kernel.nearest->differences.empty()) {
      // Same inputs, so the same key: the entry is there but failed its checks.
      fmt::print("{}{:<8} entry {} in {} is bad (see 'attnplan cache verify')\n", prefix, "miss",
                 kernel.nearest->entry->key.substr(0, 12), kernel.nearest->entry->root.string());
    } else {
      const std::vector<std::string>& differences = kernel.nearest->differences;
      fmt::print("{}{:<8} nearest entry {} in {} differs in {}:\n", prefix, "miss",
                 kernel.nearest->entry->key.substr(0, 12), kernel.nearest->entry->root.string(),
                 differences.size() == 1 ? "one input" : fmt::format("{} inputs", differences.size()));
      for (const std::string& difference : differences) fmt::print("{:<41}  {}\n", "", difference);
    }
  }
}

// One kernel as JSON: full keys, and for a miss `nearest` (null when no entry of the kernel exists) with
// the differing inputs; `differences` empty means the entry has this very key but failed its checks.
nlohmann::ordered_json explained_json(const Explained& kernel) {
  nlohmann::ordered_json json = {
      {"name", kernel.planned->name}, {"key", kernel.planned->key}, {"cache", kernel.cache}};
  if (kernel.root) {
    json["directory"] = kernel.root->string();
  } else if (kernel.nearest) {
    json["nearest"] = {{"key", kernel.nearest->entry->key},
                       {"directory", kernel.nearest->entry->root.string()},
                       {"differences", kernel.nearest->differences}};
  } else {
    json["nearest"] = nullptr;
  }
  return json;
}

// Informational: always exit 0 once the config is read, whatever would miss.
int explain(const Arguments& args, RuntimeOptions options) {
  if (args.positional().size() != 2) throw UsageError{"cache explain needs exactly one CONFIG"};
  const config::AttentionConfig config = config::load_file(args.positional()[1]);
  // Looking must not touch: read-only keeps the cache from probing, locking, quarantining or refreshing.
  options.jit = JitPolicy::read_only;
  Runtime runtime(options);
  const config::Arch arch = runtime.resolve_arch(config);
  const std::vector<PlannedKey> keys = runtime.plan_keys(config);
  std::vector<cache::EntryInfo> entries = runtime.cache().list_tiers();
  for (cache::EntryInfo& info : runtime.cache().list()) entries.push_back(std::move(info));

  std::vector<Explained> kernels;
  int misses = 0;
  for (const PlannedKey& planned : keys) {
    Explained& kernel = kernels.emplace_back();
    kernel.planned = &planned;
    kernel.root = runtime.cache().locate(planned.key);
    if (kernel.root) {
      const bool prebuilt = std::find(options.cache_path.begin(), options.cache_path.end(), *kernel.root) !=
                            options.cache_path.end();
      kernel.cache = prebuilt ? "prebuilt" : "hit";
    } else {
      ++misses;
      kernel.cache = "miss";
      kernel.nearest = nearest_entry(entries, planned);
    }
  }
  const std::size_t found = keys.size() - std::size_t(misses);

  if (args.flag("--json")) {
    nlohmann::ordered_json tiers = nlohmann::ordered_json::array();
    for (const std::filesystem::path& tier : options.cache_path) tiers.push_back(tier.string());
    nlohmann::ordered_json json = {{"config", config.name},
                                   {"arch", arch.name()},
                                   {"cache_dir", options.cache_dir.string()},
                                   {"tiers", std::move(tiers)},
                                   {"kernels", nlohmann::ordered_json::array()},
                                   {"found", found},
                                   {"compiled", misses}};
    for (const Explained& kernel : kernels) json["kernels"].push_back(explained_json(kernel));
    fmt::print("{}\n", json.dump(2));
    return kExitOk;
  }
  fmt::print("plan    {}arch {}\n", config.name.empty() ? "" : config.name + ": ", arch.name());
  fmt::print("cache   {}\n", options.cache_dir.string());
  for (const std::filesystem::path& tier : options.cache_path)
    fmt::print("tier    {} (read-only)\n", tier.string());
  print_explained_table(kernels);
  fmt::print("\n{} kernels: {} would be found, {} would be compiled\n", keys.size(), found, misses);
  return kExitOk;
}

std::uint64_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || text[0] == '-') {
    throw Error(Stage::input, fmt::format("--max-bytes {}: expected a non-negative integer", text));
  }
  return value;
}

}  // namespace

Command cache_command() {
  Command command;
  command.name = "cache";
  command.synopsis =
      "cache path|list|show KEY [--ptx|--sass|--manifest|--cubin FILE]|verify|"
      "prune [--max-bytes N]|clear|explain CONFIG [--arch A] [--json]";
  command.description =
      "Inspects and maintains the cubin cache.\n"
      "  path     print the cache directory\n"
      "  list     one line per entry: key, kernel, arch, size, spec\n"
      "  show     one entry (KEY may be a unique prefix): summary, or its manifest, PTX, SASS or cubin\n"
      "  verify   check every entry's hash and manifest; exit 1 if any is bad\n"
      "  prune    remove least-recently-used entries until the cache fits --max-bytes\n"
      "  clear    remove every entry\n"
      "  explain  for each kernel of CONFIG's plan: would it hit (in which tier), and if not, which key\n"
      "           input differs from the nearest entry of the same kernel (--json: one object)";
  command.options = {
      kCacheDirOption,
      {"--ptx", "", "show: the PTX (stored when compiled with --keep-ptx)"},
      {"--sass", "", "show: the SASS, through cuobjdump or nvdisasm"},
      {"--manifest", "", "show: the manifest JSON"},
      {"--cubin", "FILE", "show: write the entry's cubin to FILE (for nvdisasm, ncu, tools/sass.py)"},
      {"--max-bytes", "N", "prune: the size to fit (default $ATTNPLAN_CACHE_MAX_BYTES or 2 GiB)"},
      {"--arch", "A", "explain: the arch to plan for (default: the config's target.arch, else auto)"},
      {"--json", "", "explain: print {\"arch\", \"kernels\": [...], ...} on stdout instead of the table"},
      kCachePathOption};
  command.run = [](const Arguments& args) {
    if (args.positional().empty())
      throw UsageError{"missing action (path, list, show, verify, prune, clear, explain)"};
    const std::string& action = args.positional().front();
    const RuntimeOptions options = runtime_options(args);
    if (action != "show" && action != "explain" && args.positional().size() > 1) {
      throw UsageError{fmt::format("cache {} takes no further arguments", action)};
    }
    if (action == "path") {
      fmt::print("{}\n", options.cache_dir.string());
      return kExitOk;
    }
    if (action == "explain") return explain(args, options);
    if (action != "list" && action != "show" && action != "verify" && action != "prune" &&
        action != "clear") {
      throw UsageError{
          fmt::format("unknown action '{}' (path, list, show, verify, prune, clear, explain)", action)};
    }
    const std::uint64_t max_bytes =  // prune's size, checked first: bad input is an error either way
        action == "prune" && args.value("--max-bytes") ? parse_bytes(*args.value("--max-bytes"))
                                                       : options.cache_max_bytes;
    // These actions open the cache directory, which would create it: one that is not there (a mistyped
    // --cache-dir, a machine that never compiled) is reported as such instead of being made, empty.
    if (!options.cache_dir.empty() && !std::filesystem::exists(options.cache_dir)) {
      const std::string absent =
          fmt::format("no cache at {} (the directory does not exist)", options.cache_dir.string());
      if (action == "show") throw Error(Stage::input, absent);
      fmt::print("{}\n", absent);
      return kExitOk;
    }
    if (action == "list") return list(options);
    if (action == "show") return show(args, options);
    if (action == "verify") return verify(options);
    if (action == "prune") {
      const std::uint64_t removed = open_cache(options).prune(max_bytes);
      fmt::print("removed {}\n", human_bytes(removed));
      return kExitOk;
    }
    open_cache(options).clear();  // action == "clear"
    fmt::print("cleared {}\n", options.cache_dir.string());
    return kExitOk;
  };
  return command;
}

}  // namespace attnplan::cli
