#include "compiler/ptxas_report.hpp"

#include <cctype>
#include <charconv>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attnplan::compiler {

namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

// One "<count> <what>" item of a comma-separated ptxas line, e.g. {40, "registers"}, {128, "bytes smem"}.
// Text before the count ("ptxas info    : Used ", "used ") is dropped.
struct Item {
  int count = 0;
  std::string_view what;
};

bool parse_item(std::string_view text, Item& item) {
  const std::size_t digit = text.find_first_of("0123456789");
  if (digit == std::string_view::npos) return false;
  const char* first = text.data() + digit;
  const char* last = text.data() + text.size();
  const auto [end, error] = std::from_chars(first, last, item.count);
  if (error != std::errc()) return false;
  item.what = trim(std::string_view(end, static_cast<std::size_t>(last - end)));
  return true;
}

template <class Apply>
void for_each_item(std::string_view line, Apply apply) {
  while (!line.empty()) {
    const std::size_t comma = line.find(',');
    Item item;
    if (parse_item(line.substr(0, comma), item)) apply(item);
    if (comma == std::string_view::npos) break;
    line.remove_prefix(comma + 1);
  }
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// Sets `rest` to the text after `marker` when `line` contains it.
bool after(std::string_view line, std::string_view marker, std::string_view& rest) {
  const std::size_t at = line.find(marker);
  if (at == std::string_view::npos) return false;
  rest = line.substr(at + marker.size());
  return true;
}

}  // namespace

ResourceUsage parse_ptxas_report(const std::string& log, const std::string& lowered_name) {
  ResourceUsage usage;
  bool found_entry = false;
  bool found_registers = false;
  std::string entry;       // the entry function whose section we are in
  std::string properties;  // the function the next "stack frame" line describes

  std::istringstream lines(log);
  std::string line_storage;
  while (std::getline(lines, line_storage)) {
    const std::string_view line = line_storage;
    std::string_view rest;
    if (after(line, "Compiling entry function '", rest)) {
      entry = std::string(rest.substr(0, rest.find('\'')));
      properties.clear();
      if (entry == lowered_name) found_entry = true;
    } else if (after(line, "Function properties for ", rest)) {
      properties = std::string(trim(rest));
    } else if (line.find("stack frame") != std::string_view::npos) {
      if (properties != lowered_name) continue;
      for_each_item(line, [&](const Item& item) {
        if (item.what == "bytes stack frame") usage.stack_bytes = item.count;
        if (item.what == "bytes spill stores") usage.spill_store_bytes = item.count;
        if (item.what == "bytes spill loads") usage.spill_load_bytes = item.count;
      });
    } else if (line.find("Used ") != std::string_view::npos &&
               line.find("registers") != std::string_view::npos) {
      // Only entry functions get a "Used" line, and it follows their "Compiling entry function" line.
      if (entry != lowered_name) continue;
      found_registers = true;
      for_each_item(line, [&](const Item& item) {
        if (item.what == "registers") usage.registers = item.count;
        if (item.what == "barriers") usage.barriers = item.count;
        if (item.what == "bytes smem") usage.shared_bytes = item.count;
        if (starts_with(item.what, "bytes cmem[")) usage.constant_bytes += item.count;
      });
    }
  }
  if (!found_entry || !found_registers) {
    throw Error(Stage::compile,
                fmt::format("the ptxas report has no {} for kernel {} (was --ptxas-options=-v passed?)",
                            found_entry ? "register line" : "entry", lowered_name),
                log);
  }
  return usage;
}

}  // namespace attnplan::compiler
