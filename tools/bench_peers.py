#!/usr/bin/env python3
"""The peers of `attnplan bench`, on the same shapes: PyTorch SDPA (cuDNN and flash backends) for attention,
torch.matmul (cuBLAS, bf16) and torch._scaled_mm (fp8, row-wise scales) for the projections, and one attention
layer composed in PyTorch eager for the whole-layer row.

  python3 tools/bench_peers.py ROWS.json OUT.json [--iterations I] [--warmup W] [--seed X]
                               [--attnplan BINARY --workdir DIR]

ROWS.json is the list tools/bench_suite.sh writes (one object per row, "kind": attention | window | projection |
layer; window rows have no peer); OUT.json gets {"device", "torch", "cudnn", "rows": [{"id", "peers": {name: result}}]}, where a result
is {"median_ms", "min_ms", "max_ms", "tflops", "note"} or {"error": "..."} when the backend cannot run it.

Choices (docs/performance.md says the same):
- GQA: enable_gqa=True where the backend takes it; where it raises, K/V are expanded once with
  repeat_interleave outside the timed region, and the note says "repeat_interleave".
- Varlen batches: one SDPA call per sequence, all calls inside one timed region (no nested tensors).
- Causal is is_causal=True with a prefix of 0 only (PyTorch aligns the causal mask top-left; a cached prefix
  would need an explicit mask, which the flash and cuDNN backends do not take): rows with a prefix or a
  sliding window report an error instead of a wrong peer.
- FLOPs are counted as attnplan counts them (runtime/check/bench_counts.cpp): 2 (D + Dv) per allowed
  (query, key) pair per query head; 2 M N K per GEMM.
- The layer row builds its weights and input once, saves them as a safetensors layer (HF names under
  model.layers.0.) and input, runs `BINARY run` on them once (not timed) and reports the relative L2 of
  attnplan's output against the eager layer's computed in fp32 on the same bf16 values (and the eager bf16
  run's own error beside it) as "agreement"; the table fails the suite above 1e-2. RoPE is the config's
  (llama3 scaling for Llama-3.1), so both compute the same function.
- Inputs: random normal from --seed, never zeros; enough copies rotated that they span twice the L2 (50 MB on
  an H200), like attnplan bench.
- Warm-up: at least --warmup runs and at least 300 ms of back-to-back work before each timing, like attnplan
  bench: the timed runs see the clocks a sustained load gets (the H200 falls from 1980 MHz to ~1600 under its
  700 W limit after ~35 ms of attention or GEMM work; docs/performance.md, "Sustained clocks").
- Host-bound runs: each timed run sits between two events, so where Python takes longer to enqueue a run than
  the GPU takes to run it (SDPA on ~1k tokens: tens of microseconds each), the GPU waits between the first
  event and the kernel, and the time includes that wait. The attention and projection peers are then timed
  again as CUDA graph replays (graphs captured once over the input sets in rotation: a replay enqueues the same
  kernels without Python, which is how attnplan's own C++ launches reach the GPU), and the note says so. Where
  one replay a run is still host-bound (a replay and its two events cost Python tens of microseconds too), each
  graph replays several runs, up to 16, and the times are per run ("of N runs each" in the note). Where the
  capture fails, or the replays are host-bound even so, the result carries "host_ms" (the enqueue time a run)
  and its note says "host-bound": its median is an upper bound on the kernels' time.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench_matrix import rope_inv_freq  # pure rules shared with the table (same directory)

L2_BYTES = 50 * 1000 * 1000


def first_line(error):
    return (str(error).splitlines() or [type(error).__name__])[0]


def rotation_sets(set_bytes):
    return max(2, min(64, math.ceil(2 * L2_BYTES / max(set_bytes, 1))))


# Untimed work before each timing, ms: the H200 drops from its top clock to its power-limited one after
# ~35 ms of back-to-back work, so a timing from an idle GPU mixes the two (attnplan bench does the same;
# docs/performance.md, "Sustained clocks").
WARMUP_MS = 300.0


def warm_up(run, sets, warmup, warmup_ms=WARMUP_MS):
    """Runs `run` back to back, at least `warmup` times and for at least `warmup_ms` of GPU time."""
    done, elapsed, batch = 0, 0.0, 1 if warmup > 0 or warmup_ms > 0 else 0
    while batch > 0:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(done, done + batch):
            run(sets[i % len(sets)])
        stop.record()
        stop.synchronize()
        done += batch
        took = start.elapsed_time(stop)
        elapsed += took
        # A batch too short for the events to time (they resolve ~0.5 us) cannot size the next one: the
        # run count alone then bounds the warm-up.
        for_time = math.ceil((warmup_ms - elapsed) / (elapsed / done)) if 0 < took and elapsed < warmup_ms else 0
        batch = max(warmup - done, for_time)


# The host's clock for the enqueue time of a run (a stand-in in tests/tools/bench_peers_test.py).
host_clock = time.perf_counter


def time_ms(run, sets, iterations, warmup):
    """Median, min and max of `run(set)` over `iterations` runs, rotating through `sets`, after warm_up; with
    "host_ms" where enqueueing a run took the host at least the median (the module's docstring)."""
    warm_up(run, sets, warmup)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    enqueue_start = host_clock()
    for i in range(iterations):
        starts[i].record()
        run(sets[i % len(sets)])
        stops[i].record()
    host_ms = (host_clock() - enqueue_start) * 1e3 / max(iterations, 1)
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(stop) for start, stop in zip(starts, stops))
    middle = len(times) // 2
    median = times[middle] if len(times) % 2 else (times[middle - 1] + times[middle]) / 2
    timing = {"median_ms": median, "min_ms": times[0], "max_ms": times[-1]}
    if host_ms >= median:
        timing["host_ms"] = host_ms
    return timing


# The most runs one graph replays: enough that a replay's few hundred GPU microseconds outlast its enqueue.
MAX_RUNS_PER_GRAPH = 16


def capture_graphs(run, sets, runs_per_graph=1):
    """CUDA graphs that replay `run` over `sets` in rotation, `runs_per_graph` runs each (graph g: sets g * k,
    ..., g * k + k - 1, modulo their count), as many graphs as close the rotation, so that replayed in turn
    no run follows one of its own set (`run` already ran once: libraries plan and tune on the first call,
    which a capture must not see); one memory pool, since the replays run one at a time."""
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    for g in range(math.lcm(len(sets), runs_per_graph) // runs_per_graph):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            for j in range(runs_per_graph):
                run(sets[(g * runs_per_graph + j) % len(sets)])
        graphs.append(graph)
    torch.cuda.synchronize()
    return graphs


def time_peer(run, sets, iterations, warmup):
    """time_ms of `run`; where that reads host-bound, time_ms again of CUDA graph replays of it ("graph": True,
    with the eager run's enqueue time as "eager_host_ms"), each graph replaying as many runs as keep the GPU
    ahead of Python ("runs_per_graph", up to MAX_RUNS_PER_GRAPH: one replay and its two events took Python
    0.03-0.05 ms on the H100 of session 56, longer than a 1k-token SDPA), the times then per run. A run that
    cannot be captured keeps its host-bound reading, with the capture's error as "graph_error"."""
    timing = time_ms(run, sets, iterations, warmup)
    if "host_ms" not in timing:
        return timing
    runs_per_graph = 1
    while True:
        try:
            graphs = capture_graphs(run, sets, runs_per_graph)
        except RuntimeError as error:
            timing["graph_error"] = first_line(error)
            return timing
        replayed = time_ms(lambda graph: graph.replay(), graphs, iterations, warmup)
        if "host_ms" not in replayed or runs_per_graph == MAX_RUNS_PER_GRAPH:
            break
        # Enough runs that the GPU's share of a replay outlasts its enqueue twice over.
        wanted = math.ceil(2 * replayed["host_ms"] / max(replayed["median_ms"] / runs_per_graph, 1e-6))
        runs_per_graph = min(MAX_RUNS_PER_GRAPH, max(2 * runs_per_graph, wanted))
        del graphs
    per_run = {key: value / runs_per_graph for key, value in replayed.items()}
    per_run.update(graph=True, runs_per_graph=runs_per_graph, eager_host_ms=timing["host_ms"])
    return per_run


def with_rate(timing, flops, note=""):
    timing["tflops"] = flops / (timing["median_ms"] * 1e-3) / 1e12
    if timing.get("graph"):
        runs = timing["runs_per_graph"]
        graph = (f"CUDA graph replays{f' of {runs} runs each' if runs > 1 else ''}: Python took "
                 f"{timing['eager_host_ms']:.3f} ms to enqueue an eager run, longer than its kernels")
        note = "; ".join(x for x in (note, graph) if x)
    elif "graph_error" in timing:
        note = "; ".join(x for x in (note, f"no graph capture ({timing['graph_error']})") if x)
    if "host_ms" in timing:
        bound = (f"host-bound: Python took {timing['host_ms']:.3f} ms to enqueue a run, so the time includes the "
                 "GPU's wait for it (an upper bound)")
        note = "; ".join(x for x in (note, bound) if x)
    timing["note"] = note
    return timing


def attention_peers(row, iterations, warmup):
    hq, hkv, d, dv = row["query_heads"], row["kv_heads"], row["head_dim"], row["value_head_dim"]
    lengths = row["chunk_lens"]
    causal = row["mask"] == "causal"
    if row.get("prefix", 0) or row.get("window", 0):
        return {"cudnn": {"error": "prefix/window: no exact SDPA peer"}, "flash": {"error": "prefix/window"}}
    pairs = sum(n * (n + 1) // 2 if causal else n * n for n in lengths)
    flops = 2.0 * (d + dv) * hq * pairs
    tokens = sum(lengths)
    set_bytes = tokens * (hq * d + hkv * d + hkv * dv + hq * dv) * 2
    sets = []
    for _ in range(rotation_sets(set_bytes)):
        sets.append([(torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16),
                      torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16),
                      torch.randn(1, hkv, n, dv, device="cuda", dtype=torch.bfloat16)) for n in lengths])
    peers = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                def run(sequences):
                    for q, k, v in sequences:
                        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
                run(sets[0])
                torch.cuda.synchronize()
                peers[name] = with_rate(time_peer(run, sets, iterations, warmup), flops, "enable_gqa")
        except RuntimeError as gqa_error:
            try:
                group = hq // hkv
                expanded = [[(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
                             for q, k, v in sequences] for sequences in sets]
                with sdpa_kernel(backend):
                    def run_expanded(sequences):
                        for q, k, v in sequences:
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    run_expanded(expanded[0])
                    torch.cuda.synchronize()
                    peers[name] = with_rate(time_peer(run_expanded, expanded, iterations, warmup), flops,
                                            "repeat_interleave")
                del expanded
            except RuntimeError as error:
                peers[name] = {"error": f"{first_line(gqa_error)} / {first_line(error)}"}
    return peers


def projection_peers(row, iterations, warmup):
    m, n, k = row["m"], row["n"], row["k"]
    flops = 2.0 * m * n * k
    set_bytes = (m * k + n * k + m * n) * 2
    sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k))
            for _ in range(rotation_sets(set_bytes))]
    peers = {}
    try:
        peers["cublas_bf16"] = with_rate(time_peer(lambda s: torch.matmul(s[0], s[1].t()), sets, iterations,
                                                   warmup), flops, "torch.matmul")
    except RuntimeError as error:
        peers["cublas_bf16"] = {"error": first_line(error)}
    try:
        # Row-wise scales: one per activation row (token), one per weight row (output channel).
        fp8 = []
        for x, w in sets:
            x_scale = x.abs().amax(dim=1, keepdim=True).float() / 448.0
            w_scale = w.abs().amax(dim=1, keepdim=True).float() / 448.0
            fp8.append(((x / x_scale).to(torch.float8_e4m3fn), x_scale,
                        (w / w_scale).to(torch.float8_e4m3fn), w_scale.t()))
        def run(s):
            torch._scaled_mm(s[0], s[2].t(), scale_a=s[1], scale_b=s[3], out_dtype=torch.bfloat16)
        peers["scaled_mm_fp8"] = with_rate(time_peer(run, fp8, iterations, warmup), flops, "row-wise scales")
    except RuntimeError as error:
        peers["scaled_mm_fp8"] = {"error": first_line(error)}
    return peers


def rel_l2(reference, got):
    reference, got = reference.float(), got.float()
    return (torch.linalg.vector_norm(got - reference) / torch.linalg.vector_norm(reference)).item()


def layer_peer(row, iterations, warmup, attention_backend, attnplan, workdir):
    """RMSNorm, one fused QKV matmul, RoPE (rotate_half, the config's frequencies), the paged KV store
    (index_copy_ into the pool), SDPA (causal, enable_gqa, the fastest backend of the attention rows), the o
    matmul: eager PyTorch. Then, untimed, the agreement with `attnplan run` on the first set's weights."""
    config = row["layer_config"]
    hidden, hq, hkv = config["hidden_size"], config["query_heads"], config.get("kv_heads", config["query_heads"])
    d = config.get("head_dim", hidden // hq)
    dv = config.get("value_head_dim", d)
    lengths = row["chunk_lens"]
    tokens = sum(lengths)
    eps = config.get("input_norm", {}).get("epsilon", 1e-5)
    # The eager layer composes Llama's layer only; a config asking for more would time a different function.
    extras = [key for key in ("qkv_norm", "qkv_bias", "output_bias", "sliding_window", "softcap", "sinks")
              if config.get(key)]
    if config.get("input_norm", {}).get("weight_offset", 0) or extras or config.get("projection", {}).get(
            "format", "bf16") != "bf16":
        return {"eager": {"error": f"eager layer: not composed for {extras or 'norm offset / format'}"}}
    qkv_width = hq * d + hkv * d + hkv * dv
    block = row["block_size"]
    inv_freq = torch.tensor(rope_inv_freq(config), device="cuda", dtype=torch.float64)
    positions = torch.cat([torch.arange(n, device="cuda") for n in lengths]).double()
    angles = torch.outer(positions, inv_freq)
    cos64 = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, None, :]
    sin64 = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, None, :]
    blocks_per_seq = [(n + block - 1) // block for n in lengths]
    slots = torch.cat([torch.arange(n, device="cuda") + block * sum(blocks_per_seq[:s])
                       for s, n in enumerate(lengths)])

    def make_set():
        return {
            "x": torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16),
            "norm": 1 + 0.2 * torch.randn(hidden, device="cuda", dtype=torch.bfloat16),
            "w_qkv": torch.randn(qkv_width, hidden, device="cuda", dtype=torch.bfloat16) / math.sqrt(hidden),
            "w_o": torch.randn(hidden, hq * dv, device="cuda", dtype=torch.bfloat16) / math.sqrt(hq * dv),
            "k_cache": torch.empty(sum(blocks_per_seq) * block, hkv, d, device="cuda", dtype=torch.bfloat16),
            "v_cache": torch.empty(sum(blocks_per_seq) * block, hkv, dv, device="cuda", dtype=torch.bfloat16),
        }

    def stages(dtype, backend):
        return layer_stages(lengths, tokens, hidden, hq, hkv, d, dv, eps, cos64, sin64, slots, dtype, backend)

    def forward(s, dtype=torch.bfloat16, backend=attention_backend):
        """The layer in `dtype` (bf16: the timed peer, which also stores K/V into the pool; float32: the
        agreement reference, math SDPA). The stages write into a copy of the set, so nothing stays alive."""
        state = dict(s) if dtype == torch.bfloat16 else {key: s[key].to(dtype) for key in ("x", "norm", "w_qkv",
                                                                                            "w_o")}
        for name, run in stages(dtype, backend).items():
            if name != "kv_store" or dtype == torch.bfloat16:
                run(state)
        return state["out"]

    set_bytes = (tokens * hidden * 2 + qkv_width * hidden + hidden * hq * dv + tokens * qkv_width * 2) * 2
    sets = [make_set() for _ in range(rotation_sets(set_bytes))]
    flops = 2.0 * tokens * hidden * (qkv_width + hq * dv) + 2.0 * (d + dv) * hq * sum(n * (n + 1) // 2 for n in lengths)
    try:
        forward(sets[0])
        torch.cuda.synchronize()
        result = with_rate(time_ms(forward, sets, iterations, warmup), flops, f"eager, SDPA {attention_backend.name}")
    except RuntimeError as error:
        return {"eager": {"error": first_line(error)}}
    try:
        result["agreement"] = agreement(sets[0], forward, config, row, attnplan, workdir)
    except Exception as error:  # noqa: BLE001 - whatever broke, the table reports it and the suite fails
        result["agreement_error"] = f"{type(error).__name__}: {first_line(error)}"
    peers = {"eager": result}
    try:
        peers["eager_stages"] = stage_sum(sets, stages(torch.bfloat16, attention_backend), flops, iterations,
                                          warmup)
    except Exception as error:  # noqa: BLE001 - a diagnostic row: its failure must not cost the table its peers
        peers["eager_stages"] = {"error": f"{type(error).__name__}: {first_line(error)}"}
    return peers


def layer_stages(lengths, tokens, hidden, hq, hkv, d, dv, eps, cos64, sin64, slots, dtype, backend):
    """The eager layer's six stages (stage name -> function, in layer order), each a function of a state
    holding x, norm, w_qkv, w_o and the K/V pools in `dtype` and reading what the stage before it wrote
    there: the eager layer runs them in turn, stage_sum times each alone."""
    cos, sin = cos64.to(dtype), sin64.to(dtype)

    def rope(x):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def norm(s):
        s["normed"] = F.rms_norm(s["x"], (hidden,), s["norm"], eps)

    def qkv(s):
        s["qkv"] = torch.matmul(s["normed"], s["w_qkv"].t())

    def rotary(s):
        q, k, v = s["qkv"].split([hq * d, hkv * d, hkv * dv], dim=-1)
        s["q"], s["k"], s["v"] = rope(q.reshape(tokens, hq, d)), rope(k.reshape(tokens, hkv, d)), v.reshape(
            tokens, hkv, dv)

    def store(s):
        s["k_cache"].index_copy_(0, slots, s["k"])
        s["v_cache"].index_copy_(0, slots, s["v"])

    def attention(s):
        outputs, start = [], 0
        with sdpa_kernel(backend):
            for n in lengths:
                outputs.append(F.scaled_dot_product_attention(
                    s["q"][start:start + n].transpose(0, 1)[None], s["k"][start:start + n].transpose(0, 1)[None],
                    s["v"][start:start + n].transpose(0, 1)[None], is_causal=True, enable_gqa=True)[0].transpose(0, 1))
                start += n
        s["o"] = torch.cat(outputs) if len(outputs) > 1 else outputs[0]

    def output(s):
        s["out"] = torch.matmul(s["o"].reshape(tokens, hq * dv), s["w_o"].t())

    return {"input_norm": norm, "qkv_projection": qkv, "rope": rotary, "kv_store": store, "attention": attention,
            "output_projection": output}


def stage_sum(sets, stages, flops, iterations, warmup):
    """Issue 6's second layer target: the layer against the sum of the best peer kernel per stage. Each stage
    of the eager layer timed alone (median of `iterations`, rotating the sets) on inputs the stages before it
    left in the set: cuBLAS for the projections, the fastest SDPA backend, PyTorch's fused RMSNorm, eager RoPE
    (several elementwise kernels) and index_copy_ for the store. The sum of the stage medians is the peer."""
    for s in sets:  # every stage's inputs, once, untimed
        for run in stages.values():
            run(s)
    torch.cuda.synchronize()
    timings = {name: time_ms(run, sets, iterations, warmup) for name, run in stages.items()}
    total = {key: sum(t[key] for t in timings.values()) for key in ("median_ms", "min_ms", "max_ms")}
    parts = ", ".join(f"{name} {t['median_ms']:.3f}" for name, t in timings.items())
    bound = [name for name, t in timings.items() if "host_ms" in t]
    note = f"sum of the eager stages' medians ({parts} ms)"
    if bound:
        note += f"; host-bound stages (upper bounds): {', '.join(bound)}"
    result = with_rate(total, flops, note)
    result["stages"] = timings
    return result


def agreement(s, forward, config, row, attnplan, workdir):
    """`attnplan run` on the set's weights and input vs the eager layer in fp32 (math SDPA) on the same bf16
    values; the eager bf16 layer's own error beside it."""
    if not attnplan:
        raise ValueError("no --attnplan binary given")
    from safetensors.torch import load_file, save_file
    os.makedirs(workdir, exist_ok=True)
    hq, d = config["query_heads"], config.get("head_dim", config["hidden_size"] // config["query_heads"])
    hkv = config.get("kv_heads", hq)
    q, k, v = s["w_qkv"].split([hq * d, hkv * d, hkv * config.get("value_head_dim", d)], dim=0)
    prefix = "model.layers.0."
    weights = {prefix + "input_layernorm.weight": s["norm"], prefix + "self_attn.q_proj.weight": q,
               prefix + "self_attn.k_proj.weight": k, prefix + "self_attn.v_proj.weight": v,
               prefix + "self_attn.o_proj.weight": s["w_o"]}
    paths = {name: os.path.join(workdir, f"layer-{name}.safetensors") for name in ("weights", "input", "output")}
    save_file({name: t.contiguous().cpu() for name, t in weights.items()}, paths["weights"])
    starts = [0]
    for n in row["chunk_lens"]:
        starts.append(starts[-1] + n)
    save_file({"hidden_states": s["x"].contiguous().cpu(),
               "query_starts": torch.tensor(starts, dtype=torch.int32)}, paths["input"])
    command = [attnplan, "run", row["config"], "--weights", paths["weights"], "--layer", prefix,
               "--input", paths["input"], "--output", paths["output"]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        last = ((result.stderr or result.stdout).strip().splitlines() or [""])[-1]
        raise RuntimeError(f"attnplan run exited {result.returncode}: {last}")
    ours = load_file(paths["output"])["output"].cuda()
    with torch.no_grad():
        reference = forward(s, torch.float32, SDPBackend.MATH)
        bf16 = forward(s)
    torch.cuda.synchronize()
    return {"rel_l2": rel_l2(reference, ours), "bf16_rel_l2": rel_l2(reference, bf16),
            "command": " ".join(command)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows")
    parser.add_argument("out")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--attnplan", default="", help="attnplan binary, for the layer row's agreement check")
    parser.add_argument("--workdir", default=".", help="where the layer row's safetensors files go")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_peers.py: no CUDA device", file=sys.stderr)
        return 1
    torch.manual_seed(args.seed)
    with open(args.rows) as f:
        rows = json.load(f)
    results = []
    attention_best = {"cudnn": [], "flash": []}  # ms of each backend on the rows both ran, to pick the layer's
    projections = {}  # (m, n, k) -> peers: the quantized plans share the bf16 plans' shapes, timed once
    for row in rows:
        if row["kind"] == "attention":
            peers = attention_peers(row, args.iterations, args.warmup)
            if all("median_ms" in peers.get(name, {}) for name in attention_best):
                for name in attention_best:
                    attention_best[name].append(peers[name]["median_ms"])
        elif row["kind"] == "window":
            peers = {}  # ours only: the table sets the window row against the full-causal row
        elif row["kind"] == "projection":
            shape = (row["m"], row["n"], row["k"])
            if shape not in projections:
                projections[shape] = projection_peers(row, args.iterations, args.warmup)
            peers = projections[shape]
        elif row["kind"] == "layer":
            cudnn_faster = sum(attention_best["cudnn"]) <= sum(attention_best["flash"])
            backend = SDPBackend.CUDNN_ATTENTION if cudnn_faster else SDPBackend.FLASH_ATTENTION
            peers = layer_peer(row, args.iterations, args.warmup, backend, args.attnplan, args.workdir)
        else:
            raise ValueError(f"row {row['id']}: unknown kind {row['kind']}")
        results.append({"id": row["id"], "peers": peers})
        print(f"peers: {row['id']}: " + ", ".join(
            f"{name} {p['median_ms']:.3f} ms" if "median_ms" in p else f"{name} error" for name, p in peers.items()),
            file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "rows": results}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
