#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "config/hf_import.hpp"
#include "config/parse.hpp"
#include "core/error.hpp"

namespace attnplan::cli {

namespace {

nlohmann::json read_hf_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Stage::input, fmt::format("{}: cannot read the HF config", path));
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& error) {  // parse_error, or out_of_range for a number like 1e400
    throw Error(Stage::config, fmt::format("invalid JSON in {}", path), {}, {error.what()});
  }
}

int parse_layer(const Arguments& args) {
  const std::optional<std::string> text = args.value("--layer");
  if (!text) return 0;
  std::size_t used = 0;
  long long value = -1;
  try {
    value = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text->size() || value < 0 || value > (1 << 30)) {
    throw Error(Stage::input, fmt::format("--layer {}: expected a layer index >= 0", *text));
  }
  return static_cast<int>(value);
}

// Temp file + rename, so an interrupted run never leaves half a config behind.
void write_output(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path temp = path.string() + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) throw Error(Stage::input, fmt::format("--output {}: cannot write", path.string()));
  }
  std::error_code error;
  std::filesystem::rename(temp, path, error);
  if (error) {
    std::filesystem::remove(temp, error);
    throw Error(Stage::input, fmt::format("--output {}: cannot write", path.string()));
  }
}

}  // namespace

Command import_hf_command() {
  Command command;
  command.name = "import-hf";
  command.synopsis = "import-hf HF_CONFIG.json [--layer N] [--output OUT.json]";
  command.description =
      "Writes the attnplan/v1 config of one attention layer of a Hugging Face model, from its config.json\n"
      "(Llama, Mistral, Qwen2/2.5, Qwen3, Gemma 2, Gemma 3, Phi-3/Phi-4, gpt-oss, GPT-J, GPT-NeoX). Fields "
      "that\n"
      "change attention but attnplan/v1 cannot express, and fields it does not know, are errors naming\n"
      "them. A quantized checkpoint's quantization_config (fp8, awq, gptq, mxfp4, modelopt, "
      "compressed-tensors)\n"
      "or MLX quantization sets the projection formats and the KV cache dtype (docs/config.md). The result "
      "is\n"
      "validated before it is written. Exits 0 on success, 1 on bad input.";
  command.options = {
      {"--layer", "N", "the layer whose kind (sliding or full) to describe, where layers differ (default 0)"},
      {"--output", "OUT", "write the config here instead of stdout"},
  };
  command.run = [](const Arguments& args) {
    const std::string& path = args.only_positional("HF_CONFIG");
    const int layer = parse_layer(args);
    std::vector<std::string> notes;
    const config::AttentionConfig imported = config::import_hf_config(read_hf_config(path), layer, &notes);
    // What is written must read back as what was imported: parse the canonical text once more.
    const nlohmann::json document = config::to_json(imported);
    config::parse(document, "the imported config");
    const std::string text = document.dump(2) + "\n";
    for (const std::string& note : notes) fmt::print(stderr, "attnplan: note: {}\n", note);
    if (const std::optional<std::string> output = args.value("--output")) {
      write_output(*output, text);
      fmt::print(stderr, "{}: wrote {}\n", path, *output);
    } else {
      fmt::print("{}", text);
    }
    return kExitOk;
  };
  return command;
}

}  // namespace attnplan::cli
