// A Hugging Face model config.json -> the attnplan/v1 config of one of its attention layers.
// The field mapping per model family is documented in docs/config.md ("Importing a Hugging Face
// config"). Nothing that changes attention semantics is dropped silently: a field the importer does
// not know for the family, or a value attnplan/v1 cannot express, is an error naming its HF path.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/attention_config.hpp"

namespace attnplan::config {

// `hf` is the parsed config.json; `model_type` picks the family. `layer` picks the layer whose kind
// (sliding or full attention) the result describes, for models whose layers differ (Gemma 2/3,
// gpt-oss, Qwen with use_sliding_window); it must be below num_hidden_layers when that is given.
// Every problem is collected and thrown together as one Error(Stage::config) whose details() hold
// one "<HF JSON pointer>: <why>" line each, e.g.
//   "/rope_scaling/rope_type: longrope is not expressible in attnplan/v1".
// The result is resolved and valid (config::check passed). `notes`, when given, receives caveats
// that are exact enough to import but worth telling the user (GPT-J's LayerNorm, for one).
AttentionConfig import_hf_config(const nlohmann::json& hf, int layer = 0,
                                 std::vector<std::string>* notes = nullptr);

}  // namespace attnplan::config
