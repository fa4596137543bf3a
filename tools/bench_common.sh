# shellcheck shell=bash
# Sourced by tools/bench_suite.sh and tools/ab_bench.sh (not run on its own): their output, build and
# kernel-cache directories, building attnplan for a benchmark, and the lines that say where and on what a
# benchmark ran.

# OUT: where results go (default gpu-logs); BUILD: the build (ATTNPLAN_BUILD_DIR, default build-gpu); the
# JIT kernel cache in the build unless ATTNPLAN_CACHE_DIR says otherwise (tools/gpu_suite.sh's too).
BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$BENCH_ROOT/gpu-logs}"
BUILD="${ATTNPLAN_BUILD_DIR:-$BENCH_ROOT/build-gpu}"
export ATTNPLAN_CACHE_DIR="${ATTNPLAN_CACHE_DIR:-$BUILD/cache}"

# build_attnplan BUILD LOG [SOURCE]: attnplan in BUILD (configured there first when an incremental ninja
# cannot do it) from SOURCE (default: this checkout); the build's output goes to LOG and, on failure, its
# last 40 lines to stdout. Non-zero on failure.
build_attnplan() {
  local build="$1" log="$2" source="${3:-$BENCH_ROOT}"
  if [[ -x "$build/attnplan" ]] && ninja -C "$build" attnplan >"$log" 2>&1; then
    return 0
  fi
  if ! { cmake -S "$source" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNPLAN_WERROR=ON &&
         ninja -C "$build" attnplan; } >"$log" 2>&1; then
    tail -40 "$log"
    return 1
  fi
}

# machine_lines: "GPU: NAME, driver V" and "date: ..., commit: C". ATTNPLAN_COMMIT (env), when set, is the
# commit (a tree copied to a GPU machine may carry a stale .git); otherwise git's HEAD, marked when the tree
# has uncommitted changes.
machine_lines() {
  local commit
  echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  if [[ -n ${ATTNPLAN_COMMIT:-} ]]; then
    commit="$ATTNPLAN_COMMIT (given by ATTNPLAN_COMMIT)"
  else
    commit="$(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    [[ $commit != unknown ]] && ! git -C "$BENCH_ROOT" diff --quiet HEAD 2>/dev/null && commit="$commit (plus uncommitted changes)"
  fi
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit: $commit"
}

# start_clock_log FILE: the GPU's SM and memory clocks, power draw, temperature and active clock-limit
# reasons, sampled every 100 ms into FILE (nvidia-smi CSV) until stop_clock_log. The long rows' medians sit
# 10-17% above their minima in some calls (performance.md, "run to run"); with the clocks beside the
# rows' times a slower clock under sustained load can be told from a slower kernel. Does nothing where
# nvidia-smi is missing.
start_clock_log() {
  CLOCK_LOG_PID=""
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  local reasons=clocks_event_reasons.active  # clocks_throttle_reasons.active before driver 535
  nvidia-smi --query-gpu="$reasons" --format=csv,noheader >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
  # The instantaneous draw and the enforced limit (older drivers lack them: then the first six alone).
  # power.draw is a one-second average, far below what a kernel draws while it runs.
  local fields="timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons"
  nvidia-smi --query-gpu="$fields,power.draw.instant,enforced.power.limit" --format=csv >/dev/null 2>&1 &&
    fields="$fields,power.draw.instant,enforced.power.limit"
  nvidia-smi --query-gpu="$fields" --format=csv,nounits -lms 100 >"$1" 2>/dev/null &
  CLOCK_LOG_PID=$!
}

stop_clock_log() {
  [[ -n ${CLOCK_LOG_PID:-} ]] || return 0
  kill "$CLOCK_LOG_PID" 2>/dev/null
  wait "$CLOCK_LOG_PID" 2>/dev/null
  CLOCK_LOG_PID=""
}

# clock_summary FILE: one line from start_clock_log's CSV: the SM clock (min / median / max) over the busy
# samples (those without the "GPU idle" reason: the gaps between rows are left out), the highest power
# draw, and how many busy samples had a clock-limit reason (power, thermal, ...).
clock_summary() {
  python3 - "$1" <<'PY'
import csv, statistics, sys
try:
    rows = list(csv.reader(open(sys.argv[1])))[1:]
except OSError:
    rows = []
busy = []
for row in rows:
    try:
        sm, reasons = float(row[1]), int(row[5].strip(), 16)
    except (IndexError, ValueError):
        continue
    try:  # the instantaneous draw where the driver gives it, else the one-second average
        power = float(row[6]) if len(row) > 6 else float(row[3])
    except ValueError:
        power = float("nan")
    try:
        limit = float(row[7])
    except (IndexError, ValueError):
        limit = float("nan")
    if not reasons & 1:  # bit 0: the GPU is idle
        busy.append((sm, power, reasons, limit))
if not busy:
    print("clocks: not sampled")
else:
    sm = [b[0] for b in busy]
    powers = [b[1] for b in busy if b[1] == b[1]]
    limited = sum(1 for b in busy if b[2])
    capped = sum(1 for b in busy if b[2] & 0x4)  # bit 2: software power cap
    limits = [b[3] for b in busy if b[3] == b[3]]
    print(f"clocks: SM {min(sm):.0f} / {statistics.median(sm):.0f} / {max(sm):.0f} MHz (min / median / max "
          f"over {len(busy)} busy samples, every 100 ms), power max "
          f"{max(powers) if powers else float('nan'):.0f} W"
          f"{f' (limit {max(limits):.0f} W)' if limits else ''}, {limited} of them with a clock-limit reason "
          f"({capped} the power cap)")
PY
}
