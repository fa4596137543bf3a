#!/usr/bin/env python3
"""The rows of tools/bench_suite.sh, and its one table.

  python3 tools/bench_matrix.py rows DIR [--full]      writes DIR/rows.json and the bench configs into DIR
  python3 tools/bench_matrix.py table DIR HEADER.txt   reads DIR/rows.json, DIR/ours/<id>.json (attnplan bench
                                                       --json) and DIR/peers.json; prints the markdown table
                                                       and writes DIR/bench.md and DIR/bench.json

Row kinds: attention (the plan's attention stage vs SDPA cuDNN and flash), projection (the plan's q/k/v or o
GEMM vs torch.matmul bf16, with torch._scaled_mm fp8 shown beside), layer (the whole plan, eager and CUDA
graph, vs the layer composed in PyTorch eager). Standard library only.
"""

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_TOKENS = 16384
# "contiguous" for a paged-only runtime: the largest page (1024 tokens), so every K/V tile a kernel loads lies
# inside one page; the pages' order in the pool (shuffled) then costs nothing.
CONTIGUOUS_BLOCK = 1024
PROJECTION_MODELS = {"Llama-3.1-8B": "llama-3.1-8b.json", "Qwen3-32B": "qwen3-32b.json",
                     "gpt-oss-20b": "gpt-oss-20b-full.json"}


def varlen_split(tokens, seqs):
    """check::varlen_split, for the peers' shapes (bench_peers.py has the same; cross-checked in `table`)."""
    total_weight = seqs * (seqs + 1) // 2
    lengths, previous = [], 0
    for i in range(seqs):
        cumulative = tokens * ((i + 1) * (i + 2) // 2) // total_weight
        lengths.append(cumulative - previous)
        previous = cumulative
    for i, length in enumerate(lengths):
        if length == 0:
            lengths[i] = 1
            lengths[lengths.index(max(lengths))] -= 1
    return lengths


def attention_config(directory, head_dim):
    """GQA 32/8 at head_dim; a small hidden size keeps the host's random data quick (only attention counts)."""
    path = os.path.join(directory, f"attention-d{head_dim}.json")
    config = {"schema": "attnplan/v1", "name": f"bench GQA 32/8 D{head_dim}", "hidden_size": 2048,
              "query_heads": 32, "kv_heads": 8, "head_dim": head_dim, "input_norm": {"epsilon": 1e-5},
              "rotary": {"theta": 10000}, "projection": {"format": "bf16"}, "max_tokens": MAX_TOKENS,
              "target": {"arch": "auto"}}
    with open(path, "w") as f:
        json.dump(config, f, indent=1)
    return path, config


def model_config(directory, plan):
    with open(os.path.join(ROOT, "plans", plan)) as f:
        config = json.load(f)
    config["max_tokens"] = MAX_TOKENS
    path = os.path.join(directory, plan)
    with open(path, "w") as f:
        json.dump(config, f, indent=1)
    return path, config


def make_rows(directory, full, only):
    rows = []
    configs = {d: attention_config(directory, d) for d in (64, 128, 256)}

    def attention(d, mask, tokens, seqs, block):
        path, _ = configs[d]
        block_name = "contig" if block == CONTIGUOUS_BLOCK else f"b{block}"
        rows.append({"id": f"attn-d{d}-{mask}-{tokens // 1024}k-s{seqs}-{block_name}", "kind": "attention",
                     "config": path, "tokens": tokens, "seqs": seqs, "block_size": block, "mask": mask,
                     "prefix": 0, "query_heads": 32, "kv_heads": 8, "head_dim": d, "value_head_dim": d,
                     "chunk_lens": varlen_split(tokens, seqs)})

    if full:
        for d in (64, 128, 256):
            for mask in ("causal", "bidirectional"):
                for tokens in (1024, 4096, 16384):
                    for seqs in (1, 4):
                        for block in (16, 64, CONTIGUOUS_BLOCK):
                            attention(d, mask, tokens, seqs, block)
    else:
        for block in (16, 64, CONTIGUOUS_BLOCK):
            attention(128, "causal", 4096, 1, block)  # the cuDNN 583 TFLOP/s anchor, paged vs contiguous
        attention(64, "causal", 16384, 1, 64)  # anchor 468
        attention(256, "causal", 4096, 1, 64)  # anchor 655
        attention(128, "causal", 1024, 1, 64)
        attention(128, "causal", 16384, 1, 64)
        attention(128, "bidirectional", 4096, 1, 64)
        attention(128, "causal", 16384, 4, 64)
        attention(64, "bidirectional", 4096, 4, 64)

    token_counts = (512, 2048, 8192, 16384)
    for model, plan in PROJECTION_MODELS.items():
        path, config = model_config(directory, plan)
        hq, hkv = config["query_heads"], config.get("kv_heads", config["query_heads"])
        d = config.get("head_dim", config["hidden_size"] // hq)
        dv = config.get("value_head_dim", d)
        for tokens in token_counts:
            if not full and tokens not in (512, 8192) and not (model == "Llama-3.1-8B"):
                continue
            base = {"kind": "projection", "config": path, "tokens": tokens, "seqs": 1, "mask": "causal",
                    "block_size": config.get("kv_cache", {}).get("block_size", 16), "model": model,
                    "chunk_lens": [tokens]}
            rows.append(dict(base, id=f"proj-{model}-qkv-{tokens}", stage="qkv_projection", m=tokens,
                             n=hq * d + hkv * d + hkv * dv, k=config["hidden_size"]))
            rows.append(dict(base, id=f"proj-{model}-o-{tokens}", stage="output_projection", m=tokens,
                             n=config["hidden_size"], k=hq * dv, shared_run=f"proj-{model}-qkv-{tokens}"))

    path, config = model_config(directory, "llama-3.1-8b.json")
    rows.append({"id": "layer-Llama-3.1-8B-8k", "kind": "layer", "config": path, "tokens": 8192, "seqs": 1,
                 "mask": "causal", "block_size": config.get("kv_cache", {}).get("block_size", 16), "chunk_lens": [8192],
                 "layer_config": config, "shared_run": "proj-Llama-3.1-8B-qkv-8192"})
    if only:
        rows = [row for row in rows if re.search(only, row["id"])]
        kept = {row["id"] for row in rows}
        # A row whose run belongs to a row left out gets that run back (it is one `attnplan bench` call).
        for row in rows:
            if row.get("shared_run") and row["shared_run"] not in kept:
                kept.add(row["shared_run"])
                row["run_id"] = row.pop("shared_run")
    with open(os.path.join(directory, "rows.json"), "w") as f:
        json.dump(rows, f, indent=1)
    # One `attnplan bench` run per line: id, then its arguments (rows sharing a run are left out).
    for row in rows:
        if "shared_run" in row:
            continue
        print(row.get("run_id", row["id"]), row["config"], "--tokens", row["tokens"], "--seqs", row["seqs"], "--block-size",
              row["block_size"], "--mask", row["mask"])


def fmt(value, digits=1):
    return "" if value is None else f"{value:.{digits}f}"


def table(directory, header_path):
    with open(os.path.join(directory, "rows.json")) as f:
        rows = json.load(f)
    peers_path = os.path.join(directory, "peers.json")
    peers = {}
    if os.path.exists(peers_path):
        with open(peers_path) as f:
            peers = {row["id"]: row["peers"] for row in json.load(f)["rows"]}
    lines = ["| row | shape | ours ms | ours TFLOP/s | peer | peer ms | peer TFLOP/s | ours/peer | note |",
             "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    merged = []
    for row in rows:
        run_id = row.get("shared_run", row.get("run_id", row["id"]))
        ours_path = os.path.join(directory, "ours", run_id + ".json")
        ours = None
        note = ""
        if os.path.exists(ours_path):
            try:
                with open(ours_path) as f:
                    ours = json.load(f)
            except ValueError:
                note = "attnplan bench output unreadable"
        else:
            note = "attnplan bench failed (see its log)"
        if ours and ours.get("chunk_lens") != row["chunk_lens"]:
            note = f"chunk_lens differ: ours {ours.get('chunk_lens')} vs {row['chunk_lens']}"
        stages = {r["stage"]: r for r in ours["rows"]} if ours else {}
        if row["kind"] == "attention":
            mine = {"": stages.get("attention")}
            shape = f"D{row['head_dim']} {row['mask']} {row['tokens']} tok x{row['seqs']} seq, block {row['block_size']}"
            wanted = ["cudnn", "flash"]
        elif row["kind"] == "projection":
            mine = {"": stages.get(row["stage"])}
            shape = f"{row['model']} {row['stage'].split('_')[0]} {row['m']}x{row['n']}x{row['k']}"
            wanted = ["cublas_bf16", "scaled_mm_fp8"]
        else:
            mine = {"": stages.get("layer"), " (graph)": stages.get("layer_graph")}
            shape = f"Llama-3.1-8B layer, {row['tokens']} tok"
            wanted = ["eager"]
        for suffix, stage in mine.items():
            for peer_name in wanted:
                peer = peers.get(row["id"], {}).get(peer_name, {})
                ours_ms = stage["median_ms"] if stage else None
                peer_ms = peer.get("median_ms")
                ratio = peer_ms / ours_ms if ours_ms and peer_ms else None
                peer_note = peer.get("error", peer.get("note", "")) if peer else "no peer run"
                lines.append(f"| {row['id']}{suffix} | {shape} | {fmt(ours_ms, 3)} | "
                             f"{fmt(stage.get('tflops') if stage else None)} | {peer_name} | {fmt(peer_ms, 3)} | "
                             f"{fmt(peer.get('tflops'))} | {fmt(ratio, 2)} | {'; '.join(x for x in (note, peer_note) if x)} |")
                merged.append({"id": row["id"] + suffix, "kind": row["kind"], "shape": shape, "ours": stage,
                               "peer": peer_name, "peer_result": peer, "ours_over_peer": ratio})
    with open(header_path) as f:
        header = f.read().rstrip("\n")
    text = header + "\n\nours/peer = peer ms / ours ms (> 1: ours is faster).\n\n" + "\n".join(lines) + "\n"
    with open(os.path.join(directory, "bench.md"), "w") as f:
        f.write(text)
    with open(os.path.join(directory, "bench.json"), "w") as f:
        json.dump({"header": header, "rows": merged}, f, indent=1)
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rows_parser = sub.add_parser("rows")
    rows_parser.add_argument("directory")
    rows_parser.add_argument("--full", action="store_true")
    rows_parser.add_argument("--only", default="", help="keep the rows whose id matches this regex")
    table_parser = sub.add_parser("table")
    table_parser.add_argument("directory")
    table_parser.add_argument("header")
    args = parser.parse_args()
    if args.command == "rows":
        make_rows(args.directory, args.full, args.only)
    else:
        table(args.directory, args.header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
