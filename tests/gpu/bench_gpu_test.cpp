// `attnplan bench` end to end on the device: the real binary over a small batch, its JSON checked for every
// stage of the plan, positive times in order (min <= median <= max) and the host's work counts.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../tools/cli_testing.hpp"
#include "check/bench_counts.hpp"
#include "config/parse.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

namespace {

using namespace attnplan::cli_testing;

nlohmann::json bench_json(const attnplan::testing::TempDir& scratch, std::vector<std::string> args,
                          const std::string& plan = "qwen3-8b.json") {
  args.insert(args.begin(), {"bench", plan_path(plan), "--iterations", "5", "--warmup", "2", "--warmup-ms",
                             "20", "--json"});
  const Result result =
      run_cli(scratch.path(), args, {"ATTNPLAN_CACHE_DIR=" + (scratch.path() / "cache").string()});
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  return nlohmann::json::parse(result.out);
}

}  // namespace

TEST_CASE("attnplan bench times every stage and counts the work the host counts", "[gpu][bench]") {
  attnplan::testing::TempDir scratch;
  for (const std::string mask : {"causal", "bidirectional"}) {
    const std::vector<std::string> prefix =
        mask == "causal" ? std::vector<std::string>{"--prefix", "40"} : std::vector<std::string>{};
    std::vector<std::string> args = {"--tokens", "300", "--seqs", "3", "--block-size", "64", "--mask", mask};
    args.insert(args.end(), prefix.begin(), prefix.end());
    const nlohmann::json out = bench_json(scratch, args);
    INFO(out.dump(1));
    CHECK(out["chunk_lens"] == std::vector<int>{50, 100, 150});
    // The spot check ran first and passed (a failed one exits 2 with nothing timed).
    CHECK(out["check"]["rows"] == 16);
    CHECK(out["check"]["passed"] == true);
    CHECK(out["check"]["attention_relative_l2"].get<double>() <= 1e-2);
    CHECK(out["block_size"] == 64);
    CHECK(out["warmup"] == 2);
    CHECK(out["warmup_ms"] == 20);
    CHECK(out["rotation_sets"].get<int>() >= 2);
    CHECK(out["rotation_sets"].get<double>() * out["set_bytes"].get<double>() >=
          2 * out["l2_bytes"].get<double>());

    attnplan::config::AttentionConfig config = attnplan::config::load_file(plan_path("qwen3-8b.json"));
    config.bidirectional_spans = mask == "bidirectional";
    std::vector<attnplan::check::SequenceShape> sequences;
    for (int length : {50, 100, 150}) {
      attnplan::check::SequenceShape sequence{mask == "causal" ? 40 : 0, length, {}};
      if (mask == "bidirectional") sequence.spans.push_back({0, length});
      sequences.push_back(sequence);
    }
    const auto work = attnplan::check::stage_work(config, sequences);
    const nlohmann::json& rows = out["rows"];
    REQUIRE(rows.size() == work.size() + 3);  // every stage, then stages_total, layer and layer_graph
    const std::size_t iterations = out["iterations"].get<std::size_t>();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const nlohmann::json& row = rows[i];
      REQUIRE(row["runs_ms"].size() == iterations);
      CHECK(row["min_ms"].get<double>() > 0);
      CHECK(row["min_ms"].get<double>() <= row["median_ms"].get<double>());
      CHECK(row["median_ms"].get<double>() <= row["max_ms"].get<double>());
      if (i < work.size()) {
        CHECK(row["stage"] == std::string(attnplan::plan::to_string(work[i].stage)));
        // The kernel that ran: at 300 tokens both projections take their small specialization (Qwen3-8B's
        // q|k|v in 192-wide tiles, o in 128-wide ones) on an H100 / H200's 132 SMs.
        if (work[i].stage == attnplan::plan::StageKind::qkv_projection)
          CHECK(row["kernel"] == "qkv_projection_small");
        if (work[i].stage == attnplan::plan::StageKind::output_projection)
          CHECK(row["kernel"] == "output_projection_small");
        CHECK(row["flops"].get<double>() == work[i].flops);
        CHECK(row["bytes"].get<double>() == work[i].bytes);
      }
    }
    CHECK(rows[rows.size() - 3]["stage"] == "stages_total");
    CHECK(rows[rows.size() - 2]["stage"] == "layer");
    CHECK(rows[rows.size() - 1]["stage"] == "layer_graph");
    // stages_total times each run from its first event to its last: that run's stage times add up to it
    // (to the 0.1 us the runs are rounded to, per stage).
    for (std::size_t run = 0; run < iterations; ++run) {
      double stages = 0;
      for (std::size_t i = 0; i < work.size(); ++i) stages += rows[i]["runs_ms"][run].get<double>();
      CHECK(std::abs(stages - rows[work.size()]["runs_ms"][run].get<double>()) <= 1e-4 * (work.size() + 1));
    }
  }
}

TEST_CASE("attnplan bench names a q|k|v stage that ran the norms and RoPE in its epilogue", "[gpu][bench]") {
  // Qwen3-8B (q/k norms, D 128): at 4096 tokens its q|k|v launch takes the 256-wide tiling, whose tiles hold
  // whole heads, so the postprocess runs in the GEMM's epilogue and has no stage; at 300 tokens (the case
  // above) the 192-wide tiling splits heads and it is a stage of its own.
  attnplan::testing::TempDir scratch;
  const nlohmann::json out = bench_json(scratch, {"--tokens", "4096"});
  INFO(out.dump(1));
  bool qkv_seen = false;
  for (const nlohmann::json& row : out["rows"]) {
    CHECK(row["stage"] != "qkv_postprocess");
    if (row["stage"] == "qkv_projection") {
      qkv_seen = true;
      CHECK(row["kernel"] == "qkv_projection (qkv_postprocess in its epilogue)");
    }
  }
  CHECK(qkv_seen);
}

TEST_CASE("attnplan bench --trace-attention records every work item of each launch in order",
          "[gpu][bench]") {
  // Qwen3-8B: D 128, GQA 32 / 8, so 4 heads of a kv group share a CTA's 128 rows: 32 tokens per item. A
  // causal batch (no split tail): the kernel numbers ceil(longest chunk / 32) query tiles x sequences x 8
  // head groups of items and passes over those past their chunk, so a chunk of L tokens has ceil(L / 32) x 8
  // items with rows, each walked by one CTA's producer and both its consumer warpgroups.
  attnplan::testing::TempDir scratch;
  const std::filesystem::path file = scratch.path() / "trace.json";
  const nlohmann::json out = bench_json(
      scratch, {"--tokens", "1000", "--seqs", "3", "--prefix", "64", "--trace-attention", file.string()});
  INFO(out.dump(1));
  std::ifstream stream(file);
  REQUIRE(stream.good());
  const nlohmann::json trace = nlohmann::json::parse(stream);
  CHECK(trace["attention"]["traces"] == true);
  CHECK(trace["kernels"] == std::vector<std::string>{"attention"});
  const std::vector<std::string> producer = trace["producer_events"], consumer = trace["consumer_events"];
  REQUIRE(producer.size() == 6);
  REQUIRE(consumer.size() == 6);
  const std::vector<int> lengths = trace["chunk_lens"];
  int walked = 0;
  for (const int length : lengths) walked += (length + 31) / 32 * 8;
  const int items = (*std::max_element(lengths.begin(), lengths.end()) + 31) / 32 * int(lengths.size()) * 8;
  REQUIRE(!trace["launches"].empty());
  for (const nlohmann::json& launch : trace["launches"]) {
    CHECK(launch["dropped_units"] == 0);
    std::vector<int> walks(static_cast<std::size_t>(items) * 3, 0);  // per item, per role
    for (const nlohmann::json& cta : launch["ctas"]) {
      const nlohmann::json& roles = cta["roles"];
      REQUIRE(roles.size() == 3);  // the producer and two consumer warpgroups
      for (const nlohmann::json& role : roles) {
        const int r = role["role"];
        const nlohmann::json& units = role["units"];
        CHECK(role["units_walked"] == units.size());
        CHECK(role["end_ns"].get<std::uint64_t>() > role["start_ns"].get<std::uint64_t>());
        CHECK(units.size() == roles[0]["units"].size());  // every warpgroup walks the CTA's items
        std::uint64_t last = role["start_clock"];
        for (std::size_t n = 0; n < units.size(); ++n) {
          const int item = units[n]["unit"];
          REQUIRE(item >= 0);
          REQUIRE(item < items);
          CHECK(item == roles[0]["units"][n]["unit"].get<int>());
          ++walks[static_cast<std::size_t>(item) * 3 + r];
          // Events in the order the role reaches them: all of them for a consumer; the producer issues Q
          // either before or after its first tile (the TMA path: after), so its order skips q_issued.
          const std::vector<std::uint64_t> clocks = units[n]["clocks"];
          for (std::size_t e = 0; e < clocks.size(); ++e) {
            if (r == 0 && e == 2) continue;
            INFO("CTA " << cta["cta"] << " role " << r << " unit " << n << " event " << e);
            CHECK(clocks[e] >= last);
            last = clocks[e];
          }
        }
        CHECK(role["end_clock"].get<std::uint64_t>() >= last);
      }
    }
    // Each walked once by each role, and as many as have rows.
    for (std::size_t i = 0; i < walks.size(); ++i) {
      INFO("item " << i / 3 << " role " << i % 3);
      CHECK(walks[i] <= 1);
      CHECK(walks[i] == walks[i - i % 3]);  // the producer's
    }
    CHECK(std::count(walks.begin(), walks.end(), 1) == 3 * walked);
  }
}

TEST_CASE("attnplan bench names and traces the short-launch attention kernel a short launch runs",
          "[gpu][bench]") {
  // gpt-oss-20b (D 64, 64 query heads, 8 kv heads): one 256-token chunk is 16 tokens x 8 heads an item on
  // the short kernel (two consumer warpgroups, 128 rows), 16 x 8 = 128 items, one round on the H100 / H200
  // as the planned kernel's 88: launched_attention takes the short kernel, which the bench row names and
  // the trace records (three roles a CTA, each item walked once by each).
  attnplan::testing::TempDir scratch;
  const std::filesystem::path file = scratch.path() / "trace.json";
  const nlohmann::json out =
      bench_json(scratch, {"--tokens", "256", "--trace-attention", file.string()}, "gpt-oss-20b-full.json");
  INFO(out.dump(1));
  bool attention_seen = false;
  for (const nlohmann::json& row : out["rows"]) {
    if (row["stage"] != "attention") continue;
    attention_seen = true;
    CHECK(row["kernel"] == "attention_short");
  }
  CHECK(attention_seen);
  std::ifstream stream(file);
  REQUIRE(stream.good());
  const nlohmann::json trace = nlohmann::json::parse(stream);
  CHECK(trace["kernels"] == std::vector<std::string>{"attention_short"});
  CHECK(trace["attention"]["traces"] == true);
  CHECK(trace["attention"]["block_m"] == 128);
  constexpr int kItems = 256 / 16 * 8;
  REQUIRE(!trace["launches"].empty());
  for (const nlohmann::json& launch : trace["launches"]) {
    CHECK(launch["dropped_units"] == 0);
    std::vector<int> walks(static_cast<std::size_t>(kItems) * 3, 0);
    for (const nlohmann::json& cta : launch["ctas"]) {
      REQUIRE(cta["roles"].size() == 3);  // the producer and two consumer warpgroups
      for (const nlohmann::json& role : cta["roles"]) {
        for (const nlohmann::json& unit : role["units"]) {
          const int item = unit["unit"];
          REQUIRE(item >= 0);
          REQUIRE(item < kItems);
          ++walks[static_cast<std::size_t>(item) * 3 + role["role"].get<int>()];
        }
      }
    }
    CHECK(std::count(walks.begin(), walks.end(), 1) == 3 * kItems);
  }
}

TEST_CASE("attnplan bench --trace-attention refuses a plan whose attention cannot trace", "[gpu][bench]") {
  attnplan::testing::TempDir scratch;
  const std::filesystem::path file = scratch.path() / "trace.json";
  const Result result = run_cli(scratch.path(),
                                {"bench", plan_path("qwen3-8b.json"), "--tokens", "64", "--arch", "sm_80",
                                 "--trace-attention", file.string()},
                                {"ATTNPLAN_CACHE_DIR=" + (scratch.path() / "cache").string()});
  CHECK(result.exit_code == 1);
  CHECK(result.err.find("trace_attention") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(file));
}

TEST_CASE("attnplan bench runs an fp8 cache on the prefix's codes, and --no-check skips the check",
          "[gpu][bench]") {
  // The prefix slots hold the codes the fp8 store would have written (not bf16 bits read as codes): the
  // spot check reads the pool back as codes times the scales and passes.
  attnplan::testing::TempDir scratch;
  const nlohmann::json out =
      bench_json(scratch, {"--tokens", "300", "--seqs", "2", "--prefix", "100"}, "mistral-7b-fp8kv.json");
  INFO(out.dump(1));
  CHECK(out["check"]["passed"] == true);
  CHECK(out["check"]["attention_relative_l2"].get<double>() > 0);
  const nlohmann::json skipped = bench_json(scratch, {"--tokens", "300", "--no-check"});
  CHECK_FALSE(skipped.contains("check"));
  CHECK(skipped["rows"].size() > 0);
}
