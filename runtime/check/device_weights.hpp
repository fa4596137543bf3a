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

// Checks `weights` against `config` on the host, before anything is allocated: each tensor the config
// requires is present and each it excludes absent, with its shape ([Hq * D, hidden] for q_proj...) and a
// dtype the upload converts (projections bf16, as io::load_layer_weights loads them; norms, biases and sinks
// bf16, f16 or f32), and bytes matching the shape. Throws Error(input) naming the tensor, the expected and
// the actual. LayerWeightsView holds raw pointers, so this (and the loader) is where a wrong dtype is caught.
void validate_host_weights(const config::AttentionConfig& config, const io::HostLayerWeights& weights);

// validate_host_weights, then the upload. Needs a current context.
DeviceWeights upload_weights(const config::AttentionConfig& config, const io::HostLayerWeights& weights);

}  // namespace attnplan::check
