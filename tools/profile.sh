#!/usr/bin/env bash
# Nsight Compute profiles of the kernels the notes ask questions about, in one call on a GPU machine
# (docs/attention-notes.md "Where v4 stands", docs/kernels-notes.md, docs/performance.md "Rows short"):
#
#   gemm        the bf16 wgmma GEMM on Llama-3.1-8B's q|k|v and o at 8192 tokens (0.84-1.04x cuBLAS; session
#               7: the consumers wait on their own wgmmas, kernels-notes.md "Step 2")
#   attention   the sm_90a attention, D 128 GQA 32/8, 4096 tokens causal, at pages of 16 and of 64 (session 7
#               found and fixed the pages-of-16 gap with these, attention-notes.md), and at 16384 tokens
#   dequantize  the dequantize kernel of the nvfp4 and act-order GPTQ plans at 8192 tokens (~2 TB/s
#               effective: what limits it?)
#   fp8         the fp8-activation GEMM (gemm_sm90_fp8.cuh) on Llama-3.1-8B's q|k|v and o at 8192 tokens
#               (0.93x _scaled_mm at the sustained clocks, 0.78x in cycles: kernels-notes.md "Session 33")
#   fp8-peer    torch._scaled_mm's kernel (row-wise scales, as tools/bench_peers.py times it) on the same two
#               shapes: the same tile, K slot and ring depth as ours (kernels-notes.md "Session 32: what
#               `_scaled_mm` runs"), 7% faster; read beside `fp8` (tools/ncu_top.py, two files)
#   bidirectional  the sm_90a attention, D 128 GQA 32/8, 4096 tokens, one span over the chunk (0.80x cuDNN
#               where the causal row is 1.08x)
#   long        the sm_90a attention of the bench rows at 16384 tokens causal, pages of 64: D 64 (0.89x
#               cuDNN, softmax-bound) and D 128 (its steady-state loop, the bidirectional row's comparison)
#   sdpa        the sm_90a attention beside cuDNN's SDPA kernel on the same shape, D 64, 128 and 256, GQA
#               32/8, 4096 tokens, one span over the chunk, pages of 64 (session 49, at base clocks: D 128
#               level in cycles, D 64 and D 256 9-10% behind, D 256 with 48% more instructions): read each
#               pair with tools/ncu_top.py sdpa-dD-ours-sass.csv sdpa-dD-cudnn-sass.csv
#   short       D 64's short launch (two consumer warpgroups, attention-notes.md "The short kernel's loop")
#               beside cuDNN's kernel on the same shape: GQA 32/8, 1024 tokens, one span over the chunk,
#               contiguous cache (ours 0.82-0.84x cuDNN on the H100; cuDNN's D 64 kernel has the same two
#               warpgroups of 64 rows and 128-key tiles); read with tools/ncu_top.py short-d64-ours-sass.csv
#               short-d64-cudnn-sass.csv [--regions --opcodes --reasons]
#   split       the sm_90a attention, D 64 GQA 32/8, one span over 1024 and 4096 tokens: the rows whose
#               last round is split (44 items in 3 parts, 28 in 4), where a part costs ~20k SM cycles
#               more than its tiles (attention-notes.md "Session 45"): the stall samples of the partial's
#               stores, the fences around the count and the merge's loads say which
#
#   tools/profile.sh                  # every part
#   tools/profile.sh gemm attention   # just these
#
# Each profile runs `attnplan bench` under ncu (--clock-control none: leave the clocks as they are; set
# NCU_CLOCK_CONTROL=base to compare cycles at fixed clocks, as session 49's sdpa numbers were taken), skips
# the warm-up launches and records one or two launches of the kernel with the SpeedOfLight, compute, memory,
# warp-state, occupancy, launch, scheduler and source-counter sections. Writes $OUT/profile/<name>.ncu-rep
# (open in Nsight Compute), <name>.txt (ncu --page details) and <name>-sass.csv (stall samples per SASS
# instruction: read it with tools/ncu_top.py, or two side by side), prints a few lines of each, and packs
# the text files into $OUT/profile.tgz (one file: the lent GPU machine returns at most 8). Builds build-gpu
# if needed; the kernel cache is tools/gpu_suite.sh's. Exit status: non-zero when the build or a profile
# failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-logs}"
BUILD="${ATTNPLAN_BUILD_DIR:-$ROOT/build-gpu}"
NCU="${NCU:-ncu}"
CLOCK_CONTROL="${NCU_CLOCK_CONTROL:-none}"
export ATTNPLAN_CACHE_DIR="${ATTNPLAN_CACHE_DIR:-$BUILD/cache}"
DIR="$OUT/profile"
mkdir -p "$DIR"
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(gemm attention dequantize fp8 fp8-peer bidirectional long sdpa short split)
for part in "${parts[@]}"; do
  case "$part" in
    gemm | attention | dequantize | fp8 | fp8-peer | bidirectional | long | sdpa | short | split) ;;
    *) echo "unknown part '$part' (gemm attention dequantize fp8 fp8-peer bidirectional long sdpa short split)" >&2; exit 2 ;;
  esac
done

if [[ ! -x "$BUILD/attnplan" ]]; then
  if ! { cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
         ninja -C "$BUILD" attnplan; } >"$DIR/build.log" 2>&1; then
    tail -20 "$DIR/build.log"
    exit 1
  fi
fi

# Llama-3.1-8B with max_tokens 16384 (the plan's 8192 cannot take the 16k attention row).
python3 - "$ROOT/plans/llama-3.1-8b.json" "$DIR/llama-3.1-8b-16k.json" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))
config["max_tokens"] = 16384
json.dump(config, open(sys.argv[2], "w"), indent=1)
EOF

# The bench matrix's own attention configs (writes $DIR/attention-d64.json, -d128 and -d256), so the
# bidirectional, long and sdpa profiles run the kernels of the bench table's rows.
python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import bench_matrix; [bench_matrix.attention_config(sys.argv[2], d) for d in (64, 128, 256)]" \
  "$ROOT/tools" "$DIR"
# The peer of the sdpa and short parts: cuDNN's SDPA (BHSD tensors, enable_gqa, not causal) at head dim
# argv[1], GQA 32/8, argv[2] tokens (default 4096), called twice (the first call of a shape picks and loads its kernel), as
# tools/bench_peers.py calls it.
cat >"$DIR/sdpa.py" <<'EOF'
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
d = int(sys.argv[1])
s = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
q = torch.randn(1, 32, s, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 8, s, d, device="cuda", dtype=torch.bfloat16)
v = torch.randn(1, 8, s, d, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(2):
        F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True)
torch.cuda.synchronize()
EOF
# The peer of the fp8 part: torch._scaled_mm on Llama-3.1-8B's q|k|v then o shape at 8192 tokens, twice each
# (the first call of a shape picks and loads its kernel).
cat >"$DIR/scaled_mm.py" <<'EOF'
import torch
for n, k in ((6144, 4096), (4096, 4096)):
    a = (torch.randn(8192, k, device="cuda") / 4).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") / 4).to(torch.float8_e4m3fn)
    scale_a = torch.rand(8192, 1, device="cuda") + 0.5
    scale_w = torch.rand(1, n, device="cuda") + 0.5
    for _ in range(2):
        torch._scaled_mm(a, w.t(), scale_a=scale_a, scale_b=scale_w, out_dtype=torch.bfloat16)
torch.cuda.synchronize()
EOF
status=0
# profile NAME KERNEL_REGEX SKIP COUNT -- ARGS...: ARGS are `attnplan bench`'s, or a whole command that
# starts with python3.
profile() {
  local name="$1" kernel="$2" skip="$3" count="$4"
  shift 5
  local command=("$@")
  [[ $1 == python3 ]] || command=("$BUILD/attnplan" bench "$@" --iterations 2 --warmup 2 --warmup-ms 0)
  if ! "$NCU" --clock-control "$CLOCK_CONTROL" -f -o "$DIR/$name" -k "regex:$kernel" --launch-skip "$skip" \
      --launch-count "$count" --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
      --section SourceCounters --section SchedulerStats \
      "${command[@]}" >"$DIR/$name.log" 2>&1; then
    echo "$name: ncu failed (see $DIR/$name.log)"
    tail -5 "$DIR/$name.log"
    status=1
    return
  fi
  "$NCU" --import "$DIR/$name.ncu-rep" --page details >"$DIR/$name.txt" 2>&1
  "$NCU" --import "$DIR/$name.ncu-rep" --page source --csv --print-source sass >"$DIR/$name-sass.csv" 2>&1
  echo "== $name"
  grep -E "^\s*(Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active)\b" \
    "$DIR/$name.txt" | sed 's/  */ /g' | head -24
}

for part in "${parts[@]}"; do
  start=$SECONDS
  case "$part" in
    gemm)
      # Each execute launches the q|k|v then the o GEMM: skip the warm-up's, take one of each.
      profile gemm-llama-8k "gemm_sm90_kernel" 4 2 -- "$ROOT/plans/llama-3.1-8b.json" --tokens 8192
      ;;
    attention)
      for block in 16 64; do
        profile "attention-d128-4k-p$block" "attention_sm90_kernel" 2 1 -- "$ROOT/plans/llama-3.1-8b.json" \
          --tokens 4096 --block-size "$block"
      done
      profile attention-d128-16k-p64 "attention_sm90_kernel" 2 1 -- "$DIR/llama-3.1-8b-16k.json" \
        --tokens 16384 --block-size 64
      ;;
    dequantize)
      for plan in llama-3.1-8b-nvfp4 llama-3.1-8b-gptq; do
        profile "dequantize-$plan-8k" "dequantize_kernel" 4 2 -- "$ROOT/plans/$plan.json" --tokens 8192
      done
      ;;
    fp8)
      # Each execute launches the q|k|v then the o fp8 GEMM: skip the warm-up's, take one of each.
      profile fp8-llama-8k "gemm_sm90_fp8_kernel" 4 2 -- "$ROOT/plans/llama-3.1-8b-fp8-dynamic.json" \
        --tokens 8192
      ;;
    fp8-peer)
      # The second call of each shape: launches 1 (q|k|v) and 3 (o) of the kernels whose names start nvjet.
      profile fp8-peer-qkv-8k "nvjet" 1 1 -- python3 "$DIR/scaled_mm.py"
      profile fp8-peer-o-8k "nvjet" 3 1 -- python3 "$DIR/scaled_mm.py"
      ;;
    bidirectional)
      profile attention-d128-4k-bidirectional "attention_sm90_kernel" 2 1 -- "$DIR/attention-d128.json" \
        --tokens 4096 --block-size 64 --mask bidirectional
      ;;
    long)
      for dim in 64 128; do
        profile "long-d$dim-16k-p64" "attention_sm90_kernel" 2 1 -- "$DIR/attention-d$dim.json" \
          --tokens 16384 --block-size 64
      done
      ;;
    sdpa)
      for dim in 64 128 256; do
        profile "sdpa-d$dim-ours" "attention_sm90_kernel" 2 1 -- "$DIR/attention-d$dim.json" \
          --tokens 4096 --block-size 64 --mask bidirectional
        profile "sdpa-d$dim-cudnn" "cudnn" 1 1 -- python3 "$DIR/sdpa.py" "$dim"
      done
      ;;
    short)
      profile short-d64-ours "attention_sm90_kernel" 2 1 -- "$DIR/attention-d64.json" \
        --tokens 1024 --block-size 1024 --mask bidirectional
      profile short-d64-cudnn "cudnn" 1 1 -- python3 "$DIR/sdpa.py" 64 1024
      ;;
    split)
      for tokens in 1024 4096; do
        profile "split-d64-$tokens-bidirectional" "attention_sm90_kernel" 2 1 -- "$DIR/attention-d64.json" \
          --tokens "$tokens" --block-size 64 --mask bidirectional
      done
      ;;
  esac
  echo "== $part: $((SECONDS - start)) s"
done
(cd "$DIR" && tar czf "$OUT/profile.tgz" -- *.txt *.csv 2>/dev/null)
exit $status
