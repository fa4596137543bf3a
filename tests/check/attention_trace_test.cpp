// The attention trace's decoding (check/attention_trace.hpp) over buffers laid out as the kernel writes them
// (attention_params.h): which slots count, the header, each unit's events, what a slot cannot hold.
#include "check/attention_trace.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using namespace attnplan;
using namespace attnplan::check;

namespace {

// A zeroed trace buffer, and writers of one slot's records as the kernel's lanes write them.
struct Buffer {
  std::vector<std::uint64_t> words =
      std::vector<std::uint64_t>(static_cast<std::size_t>(kAttentionTraceBytes / 8), 0);

  void put(int cta, int role, int record, std::uint64_t first, std::uint64_t second) {
    const auto slot = static_cast<std::size_t>(attention_trace_slot_word(cta, role));
    words[slot + 2 * std::size_t(record)] = first;
    words[slot + 2 * std::size_t(record) + 1] = second;
  }
  // A warpgroup that walked `units` (their indices), starting at `clock` and spending 10 cycles per event.
  void walk(int cta, int role, int sm, const std::vector<int>& units, std::uint64_t clock) {
    put(cta, role, 0, clock, 1000 + clock);
    for (std::size_t n = 0; n < units.size(); ++n) {
      for (int event = 0; event < kAttentionTraceEventsPerUnit; ++event) {
        clock += 10;
        const int record = attention_trace_event_record(int(n), event);
        if (record < kAttentionTraceRecords) put(cta, role, record, clock, std::uint64_t(units[n]));
      }
    }
    put(cta, role, 1, clock + 5, 1000 + clock + 5);
    put(cta, role, 2, std::uint64_t(sm), units.size());
  }
};

}  // namespace

TEST_CASE("an attention trace decodes the slots that walked units, in CTA and role order", "[check][trace]") {
  Buffer buffer;
  buffer.walk(0, 0, 7, {0, 132}, 100);
  buffer.walk(0, 1, 7, {0, 132}, 105);
  buffer.walk(0, 2, 7, {0, 132}, 110);
  buffer.walk(5, 0, 3, {5}, 5000);  // CTA 5 ran one item; its consumers' slots below
  buffer.walk(5, 1, 3, {5}, 5001);
  buffer.walk(5, 2, 3, {5}, 5002);
  const AttentionTrace trace = decode_attention_trace(buffer.words, 3);
  REQUIRE(trace.ctas.size() == 2);
  CHECK(trace.dropped_units == 0);
  CHECK(trace.ctas[0].cta == 0);
  CHECK(trace.ctas[1].cta == 5);
  const TracedRole& consumer = trace.ctas[0].roles[1];
  CHECK(consumer.role == 1);
  CHECK(consumer.sm == 7);
  CHECK(consumer.start_clock == 105);
  CHECK(consumer.start_ns == 1105);
  CHECK(consumer.units_walked == 2);
  REQUIRE(consumer.units.size() == 2);
  CHECK(consumer.units[1].unit == 132);
  CHECK(consumer.units[1].clocks[0] == 105 + 10 * 7);
  CHECK(consumer.end_clock == 105 + 10 * 12 + 5);
  CHECK(trace.ctas[1].roles[2].units[0].unit == 5);

  const nlohmann::ordered_json json = to_json(trace);
  CHECK(json["ctas"][1]["cta"] == 5);
  CHECK(json["ctas"][0]["roles"][1]["units"][1]["clocks"][0] == 105 + 10 * 7);
  CHECK(producer_event_names().size() == kAttentionTraceEventsPerUnit);
  CHECK(consumer_event_names()[kTraceConsumerStored] == "stored");
}

TEST_CASE("an attention trace counts the units past a slot's capacity and refuses what is no trace",
          "[check][trace]") {
  const int capacity = kAttentionTraceRecordedUnits;
  Buffer buffer;
  std::vector<int> many(static_cast<std::size_t>(capacity) + 3);
  for (std::size_t n = 0; n < many.size(); ++n) many[n] = int(n);
  buffer.walk(1, 0, 0, many, 10);
  const AttentionTrace trace = decode_attention_trace(buffer.words, 4);
  REQUIRE(trace.ctas.size() == 1);
  CHECK(trace.ctas[0].roles[0].units_walked == capacity + 3);
  CHECK(trace.ctas[0].roles[0].units.size() == std::size_t(capacity));
  CHECK(trace.dropped_units == 3);

  CHECK(expect_error([&] { decode_attention_trace(std::vector<std::uint64_t>(8), 3); })
            .message()
            .find("kAttentionTraceBytes") != std::string::npos);
  CHECK(expect_error([&] { decode_attention_trace(buffer.words, 5); }).message().find("warpgroups") !=
        std::string::npos);
  Buffer backwards;
  backwards.walk(0, 0, 0, {0}, 100);
  backwards.put(0, 0, kAttentionTraceHeaderRecords + 1, 50, 0);  // an event before the role's start
  CHECK(expect_error([&] { decode_attention_trace(backwards.words, 3); }).message().find("not a trace") !=
        std::string::npos);
  Buffer renamed;
  renamed.walk(0, 1, 0, {4}, 100);
  renamed.put(0, 1, kAttentionTraceHeaderRecords + 3, 140, 9);  // event 3 names another unit
  CHECK(expect_error([&] { decode_attention_trace(renamed.words, 3); }).message().find("names unit 9") !=
        std::string::npos);
}
