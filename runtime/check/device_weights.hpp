// A layer's weights copied to the device in the layout PrefillPlan::execute reads (a fused qkv_proj is
// the q, k and v rows back to back, as checkpoints store it; sinks as fp32). For the CLI and the tests:
// an engine keeps its own weights and fills LayerWeightsView itself.
#pragma once

#include <vector>

#include "config/attention_config.hpp"
#include "driver/memory.hpp"
#include "io/layer_weights.hpp"
#include "plan/prefill_plan.hpp"

namespace attnplan::check {

struct DeviceWeights {
  std::vector<driver::DeviceBuffer> buffers;  // own what `view` points at
  plan::LayerWeightsView view;
};

// Needs a current context.
DeviceWeights upload_weights(const config::AttentionConfig& config, const io::HostLayerWeights& weights);

}  // namespace attnplan::check
