#!/usr/bin/env bash
# The benchmark table of docs/performance.md in one call on a GPU machine: builds attnplan (build-gpu), runs
# `attnplan bench --json` on every row of tools/bench_matrix.py and tools/bench_peers.py (PyTorch SDPA cuDNN /
# flash, torch.matmul, torch._scaled_mm, an eager PyTorch layer) on the same shapes, and prints ONE markdown
# table with ours/peer per row, headed by GPU, driver, date and commit. Writes $OUT/bench.md and
# $OUT/bench.json (and each run's JSON and log under $OUT/bench/).
#
#   tools/bench_suite.sh [--full] [--only REGEX] [--iterations I]
#
# Default: a representative subset. Phase 1's subset took 133 s on the H200 (docs/performance.md); phase 2 adds
# (estimates): two window runs at 32k tokens (~10 s each: 35 + 2x30 executes of ~40 ms full-causal attention,
# plus the host's random data), twelve quantized-plan runs at 512 and 8k tokens (~5 s each, most of it the
# cold JIT compile of each format's kernels and the host's random weights; refused plans fail in < 1 s), no new
# peer shapes (the quantized plans share the bf16 plans' shapes; peers are timed once per shape), and the
# layer row's agreement check (one `attnplan run` at 8k tokens and one fp32 eager layer, ~10 s): about
# 133 + 20 + 60 + 10 = ~225 s in all, under 4 minutes. --full: every row of
# the matrix (GQA 32/8 x D 64/128/256 x causal/bidirectional x 1k/4k/16k x 1/4 sequences x block 16/64/
# contiguous, and every projection shape at 512/2k/8k/16k tokens: estimated 12-15 minutes, so split it over calls
# with --only, e.g. --only attn-d64, --only attn-d128, --only 'attn-d256|proj|layer'; each call writes its own
# table). --only keeps the rows whose id matches the extended regex (a window row brings its full-causal
# baseline). Exit status: non-zero when the build fails, any row did not run (a plan refused at planning,
# "not supported by the kernels yet", is reported in its row's note, not a failure), or the layer row's eager
# peer does not agree with `attnplan run` (relative L2 above 1e-2). ATTNPLAN_COMMIT (env), when set, is the
# commit printed in the header (a copied tree's .git may be stale); otherwise git's HEAD.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=tools/bench_common.sh
source "$ROOT/tools/bench_common.sh"  # OUT, BUILD, ATTNPLAN_CACHE_DIR
FULL=""
ITERATIONS=30
ONLY=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --full) FULL="--full" ;;
    --iterations) ITERATIONS="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    *) echo "usage: tools/bench_suite.sh [--full] [--only REGEX] [--iterations I]" >&2; exit 1 ;;
  esac
  shift
done
WORK="$OUT/bench"
mkdir -p "$WORK/ours"
status=0

build_attnplan "$BUILD" "$WORK/build.log" || exit 1

{
  machine_lines
  echo "torch: $(python3 -c 'import torch; print(torch.__version__, "cuDNN", torch.backends.cudnn.version())' 2>/dev/null || echo 'not importable')"
  echo "attnplan bench and peers: median of $ITERATIONS runs after >= 5 warm-up runs and >= 300 ms of work (sustained clocks), inputs rotated over > 2x L2"
} >"$WORK/header.txt"
cat "$WORK/header.txt"

python3 "$ROOT/tools/bench_matrix.py" rows "$WORK" $FULL ${ONLY:+--only "$ONLY"} >"$WORK/runs.txt" || exit 1
echo "== attnplan bench: $(wc -l <"$WORK/runs.txt") runs"
start_clock_log "$WORK/clocks.csv"
trap stop_clock_log EXIT
start=$SECONDS
while read -r id config rest; do
  # shellcheck disable=SC2086  # rest is the run's own argument list
  if "$BUILD/attnplan" bench "$config" $rest --iterations "$ITERATIONS" --json \
       >"$WORK/ours/$id.json" 2>"$WORK/ours/$id.log"; then
    printf '%-44s ok   (%d s)\n' "$id" $((SECONDS - start))
  elif grep -q "not supported by the kernels yet" "$WORK/ours/$id.log"; then
    # A format without kernels yet (runtime/plan/kernel_plan.cpp's words): the table's note says so.
    printf '%-44s refused at planning (see its note)\n' "$id"
    rm -f "$WORK/ours/$id.json"
  else
    printf '%-44s FAILED: %s\n' "$id" "$(tail -1 "$WORK/ours/$id.log")"
    rm -f "$WORK/ours/$id.json"
    status=1
  fi
done <"$WORK/runs.txt"

echo "== peers (PyTorch)"
python3 "$ROOT/tools/bench_peers.py" "$WORK/rows.json" "$WORK/peers.json" --iterations "$ITERATIONS" \
  --attnplan "$BUILD/attnplan" --workdir "$WORK/layer" 2>"$WORK/peers.log" || { tail -20 "$WORK/peers.log"; status=1; }
echo "   $((SECONDS - start)) s so far"
stop_clock_log
clock_summary "$WORK/clocks.csv" | tee -a "$WORK/header.txt"

# Non-zero when the layer row's eager peer and `attnplan run` disagree (or the check could not run).
python3 "$ROOT/tools/bench_matrix.py" table "$WORK" "$WORK/header.txt" || status=1
cp "$WORK/bench.md" "$WORK/bench.json" "$OUT/" 2>/dev/null || status=1
cp "$WORK/clocks.csv" "$OUT/" 2>/dev/null
exit $status
