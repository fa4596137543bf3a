// The sm_90a attention kernel's trace (AttentionSpec::traces), read back from AttentionParams::trace:
// for every CTA of one launch and each of its warpgroups, the clock at the fixed points of each work unit
// it walked (attention_params.h, AttentionTraceEvent). `attnplan bench --trace-attention FILE` writes it
// as JSON (to_json); tools/attention_trace.py prints where an item's time goes. Pure, no CUDA.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnplan/attention_params.h"

namespace attnplan::check {

// One unit a warpgroup walked: its index in the launch's walk and the clock (SM cycles, %clock64) at
// each of its kAttentionTraceEventsPerUnit events.
struct TracedUnit {
  int unit = 0;
  std::uint64_t clocks[kAttentionTraceEventsPerUnit] = {};
};

// One warpgroup of one CTA: role 0 the producer, 1 + w consumer warpgroup w.
struct TracedRole {
  int role = 0;
  int sm = 0;
  std::uint64_t start_clock = 0, end_clock = 0;  // its first unit's start and its last unit's end
  std::uint64_t start_ns = 0, end_ns = 0;        // the same moments by %globaltimer
  int units_walked = 0;                          // all of them, recorded or not
  std::vector<TracedUnit> units;                 // the recorded ones (the slot's capacity), in walk order
};

struct TracedCta {
  int cta = 0;
  std::vector<TracedRole> roles;  // those that walked a unit, by role
};

// One launch's trace.
struct AttentionTrace {
  std::vector<TracedCta> ctas;  // those that walked a unit, by index
  int dropped_units = 0;        // units walked past a slot's capacity (counted, not recorded)
};

// The names of each role's events, in record order (the JSON's and the tool's).
std::span<const std::string_view> producer_event_names();
std::span<const std::string_view> consumer_event_names();

// Decodes `words` (the trace buffer: kAttentionTraceBytes / 8 words, as the kernel left it after the host
// zeroed it) for a kernel of `roles` warpgroups (1 + consumers). A slot whose units-walked word is zero
// was not used. Throws Error(input) for a buffer of another size, roles outside [2,
// kAttentionTraceRoles], or a slot whose clocks run backwards (a buffer that is not a trace).
AttentionTrace decode_attention_trace(std::span<const std::uint64_t> words, int roles);

// {"dropped_units", "ctas": [{"cta", "roles": [{"role", "sm", "start_clock", "end_clock", "start_ns",
// "end_ns", "units_walked", "units": [{"unit", "clocks": [...]}]}]}]}; the caller adds the launch's
// shape and the event names.
nlohmann::ordered_json to_json(const AttentionTrace& trace);

}  // namespace attnplan::check
