#include "check/attention_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "core/error.hpp"

namespace attnplan::check {

namespace {

// The names, indexed by AttentionTraceEvent.
constexpr std::array<std::string_view, kAttentionTraceEventsPerUnit> kProducerEvents = {
    "begin", "first_tile_issued", "q_issued", "last_tile_issued", "next_claimed", "next_q_prefetched"};
constexpr std::array<std::string_view, kAttentionTraceEventsPerUnit> kConsumerEvents = {
    "begin", "first_tile_landed", "first_softmax_done", "last_product_done", "stored", "next_handed_over"};
static_assert(kTraceProducerPrefetched == kAttentionTraceEventsPerUnit - 1 &&
              kTraceConsumerNext == kAttentionTraceEventsPerUnit - 1);

}  // namespace

std::span<const std::string_view> producer_event_names() {
  return kProducerEvents;
}
std::span<const std::string_view> consumer_event_names() {
  return kConsumerEvents;
}

AttentionTrace decode_attention_trace(std::span<const std::uint64_t> words, int roles) {
  if (words.size() * 8 != static_cast<std::size_t>(kAttentionTraceBytes)) {
    throw Error(Stage::input, fmt::format("attention trace: {} bytes, expected kAttentionTraceBytes = {}",
                                          words.size() * 8, kAttentionTraceBytes));
  }
  if (roles < 2 || roles > kAttentionTraceRoles) {
    throw Error(Stage::input, fmt::format("attention trace: {} warpgroups; the kernel has 3 or 4 (a producer "
                                          "and 2 or 3 consumer warpgroups)",
                                          roles));
  }
  AttentionTrace trace;
  for (int cta = 0; cta < kAttentionTraceCtas; ++cta) {
    TracedCta traced_cta{cta, {}};
    for (int role = 0; role < roles; ++role) {
      // Two words per record; the slots are CTA-major (attention_params.h).
      const auto slot = static_cast<std::size_t>(attention_trace_slot_word(cta, role));
      auto word = [&](int record, int half) { return words[slot + 2 * std::size_t(record) + half]; };
      const std::uint64_t walked = word(2, 1);
      if (walked == 0) continue;
      TracedRole traced;
      traced.role = role;
      traced.sm = static_cast<int>(word(2, 0));
      traced.start_clock = word(0, 0);
      traced.start_ns = word(0, 1);
      traced.end_clock = word(1, 0);
      traced.end_ns = word(1, 1);
      traced.units_walked = static_cast<int>(walked);
      if (walked > static_cast<std::uint64_t>(1) << 30 || traced.end_clock < traced.start_clock) {
        throw Error(
            Stage::input,
            fmt::format("attention trace: CTA {} warpgroup {}: {} units, clock {} to {} (not a trace)", cta,
                        role, walked, traced.start_clock, traced.end_clock));
      }
      const int recorded = std::min(traced.units_walked, kAttentionTraceRecordedUnits);
      trace.dropped_units += traced.units_walked - recorded;
      for (int n = 0; n < recorded; ++n) {
        TracedUnit unit;
        for (int event = 0; event < kAttentionTraceEventsPerUnit; ++event) {
          const int record = attention_trace_event_record(n, event);
          unit.clocks[event] = word(record, 0);
          if (unit.clocks[event] < traced.start_clock || unit.clocks[event] > traced.end_clock) {
            throw Error(
                Stage::input,
                fmt::format("attention trace: CTA {} warpgroup {} unit {} event {}: clock {} outside "
                            "the warpgroup's [{}, {}] (not a trace, or an event never recorded)",
                            cta, role, n, event, unit.clocks[event], traced.start_clock, traced.end_clock));
          }
          // Every event of a unit names it.
          if (event == 0) unit.unit = static_cast<int>(word(record, 1));
          if (word(record, 1) != static_cast<std::uint64_t>(unit.unit)) {
            throw Error(Stage::input,
                        fmt::format("attention trace: CTA {} warpgroup {} unit {}: event {} names unit {}, "
                                    "event 0 unit {} (not a trace)",
                                    cta, role, n, event, word(record, 1), unit.unit));
          }
        }
        traced.units.push_back(unit);
      }
      traced_cta.roles.push_back(std::move(traced));
    }
    if (!traced_cta.roles.empty()) trace.ctas.push_back(std::move(traced_cta));
  }
  return trace;
}

nlohmann::ordered_json to_json(const AttentionTrace& trace) {
  nlohmann::ordered_json ctas = nlohmann::ordered_json::array();
  for (const TracedCta& cta : trace.ctas) {
    nlohmann::ordered_json roles = nlohmann::ordered_json::array();
    for (const TracedRole& role : cta.roles) {
      nlohmann::ordered_json units = nlohmann::ordered_json::array();
      for (const TracedUnit& unit : role.units)
        units.push_back({{"unit", unit.unit}, {"clocks", unit.clocks}});
      roles.push_back({{"role", role.role},
                       {"sm", role.sm},
                       {"start_clock", role.start_clock},
                       {"end_clock", role.end_clock},
                       {"start_ns", role.start_ns},
                       {"end_ns", role.end_ns},
                       {"units_walked", role.units_walked},
                       {"units", std::move(units)}});
    }
    ctas.push_back({{"cta", cta.cta}, {"roles", std::move(roles)}});
  }
  return {{"dropped_units", trace.dropped_units}, {"ctas", std::move(ctas)}};
}

}  // namespace attnplan::check
