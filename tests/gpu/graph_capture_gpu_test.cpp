// Plan launches allocate nothing and never synchronize, so a host engine can capture them in a CUDA graph.
#include "core/bf16.hpp"
#include "driver/cuda_api.hpp"
#include "driver/memory.hpp"
#include "driver/stream.hpp"
#include "gpu_support.hpp"
#include "support/catch.hpp"

using namespace attnplan;
using namespace attnplan::gpu_testing;

TEST_CASE("input norm and KV store captured in a CUDA graph replay the direct results", "[gpu][graph]") {
  const config::AttentionConfig config = make_config(1024, 8, 8, 128, 128, 16);
  plan::PrefillPlan plan = gpu().load(config);
  std::mt19937_64 rng(77);
  const int tokens = 40;
  const int num_blocks = 4;
  driver::DeviceBuffer input = driver::DeviceBuffer::from_host(random_bf16(tokens * 1024, rng));
  driver::DeviceBuffer weight = driver::DeviceBuffer::from_host(random_bf16(1024, rng, 1.0, 0.2));
  driver::DeviceBuffer normed(tokens * 1024 * 2);
  driver::DeviceBuffer key_cache(num_blocks * 16 * 1024 * 2), value_cache(num_blocks * 16 * 1024 * 2);
  const std::vector<int> query_starts = {0, tokens}, context_lens = {3}, block_tables = {2, 0, 3, 1};
  driver::DeviceBuffer d_starts = driver::DeviceBuffer::from_host(query_starts);
  driver::DeviceBuffer d_context = driver::DeviceBuffer::from_host(context_lens);
  driver::DeviceBuffer d_tables = driver::DeviceBuffer::from_host(block_tables);

  // A non-blocking stream does not order with the legacy default stream: every memset goes on it too.
  driver::Stream stream = driver::Stream::create();
  plan::InputNormArgs norm;
  norm.input = input.data<const void>();
  norm.weight = weight.data<const void>();
  norm.output = normed.data<void>();
  norm.num_tokens = tokens;
  plan::KvStoreArgs store;
  store.key = normed.data<const void>();  // any bf16 rows will do: the normed activations
  store.value = input.data<const void>();
  store.cache = {key_cache.data<void>(), value_cache.data<void>(), num_blocks};
  store.batch.num_seqs = 1;
  store.batch.num_tokens = tokens;
  store.batch.max_query_len = tokens;
  store.batch.max_blocks_per_seq = 4;
  store.batch.query_starts = d_starts.data<const int>();
  store.batch.context_lens = d_context.data<const int>();
  store.batch.block_tables = d_tables.data<const int>();

  gpu().context.synchronize();  // uploads from pageable memory may still be in flight on the legacy stream
  auto run_direct = [&] {
    normed.fill_bytes_async(kPoisonByte, stream.handle());
    key_cache.fill_bytes_async(kPoisonByte, stream.handle());
    value_cache.fill_bytes_async(kPoisonByte, stream.handle());
    plan.launch_input_norm(norm, stream.handle());
    plan.launch_kv_store(store, stream.handle());
    stream.synchronize();
    return std::make_tuple(normed.download_all<std::uint16_t>(), key_cache.download_all<std::uint16_t>(),
                           value_cache.download_all<std::uint16_t>());
  };
  const auto direct = run_direct();

  const driver::CudaApi& cu = driver::api();
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  driver::check(cu.cuStreamBeginCapture(stream.handle(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture");
  plan.launch_input_norm(norm, stream.handle());
  plan.launch_kv_store(store, stream.handle());
  driver::check(cu.cuStreamEndCapture(stream.handle(), &graph), "cuStreamEndCapture");
  driver::check(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiateWithFlags");
  for (int replay = 0; replay < 2; ++replay) {
    normed.fill_bytes_async(kPoisonByte, stream.handle());
    key_cache.fill_bytes_async(kPoisonByte, stream.handle());
    value_cache.fill_bytes_async(kPoisonByte, stream.handle());
    driver::check(cu.cuGraphLaunch(exec, stream.handle()), "cuGraphLaunch");
    stream.synchronize();
    CHECK(normed.download_all<std::uint16_t>() == std::get<0>(direct));
    CHECK(key_cache.download_all<std::uint16_t>() == std::get<1>(direct));
    CHECK(value_cache.download_all<std::uint16_t>() == std::get<2>(direct));
  }
  driver::check(cu.cuGraphExecDestroy(exec), "cuGraphExecDestroy");
  driver::check(cu.cuGraphDestroy(graph), "cuGraphDestroy");

  // The captured chunk (positions 3..42 through pages 2, 0, 3) wrote 40 slots; the rest stayed poisoned.
  std::size_t written_rows = 0;
  const std::vector<std::uint16_t>& keys = std::get<1>(direct);
  for (std::size_t slot = 0; slot < std::size_t(num_blocks) * 16; ++slot) {
    written_rows += keys[slot * 1024] != kPoisonBits;
  }
  CHECK(written_rows == std::size_t(tokens));
}
