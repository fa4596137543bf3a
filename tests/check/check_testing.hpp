// What the check module's tests share.
#pragma once

#include <nlohmann/json.hpp>

#include "config/parse.hpp"

namespace attnplan::check_testing {

// A small valid config with every optional weight (q|k|v and o biases, sinks): 256 wide, 4 / 2 heads of 64.
inline config::AttentionConfig small_config() {
  return config::parse(nlohmann::json{{"schema", "attnplan/v1"},
                                      {"hidden_size", 256},
                                      {"query_heads", 4},
                                      {"kv_heads", 2},
                                      {"head_dim", 64},
                                      {"qkv_bias", true},
                                      {"output_bias", true},
                                      {"sinks", true}});
}

}  // namespace attnplan::check_testing
