#!/usr/bin/env bash
# Everything that needs a GPU, in one go (for a lent GPU machine or a developer's workstation): build,
# the GPU test executable, `attnplan verify` of every plan, and the HF transformers layer comparison.
# Logs go to $OUT (default: ./gpu-logs). Exit status: non-zero if any part failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-logs}"
BUILD="${ATTNPLAN_BUILD_DIR:-$ROOT/build-gpu}"
mkdir -p "$OUT"
export ATTNPLAN_CACHE_DIR="${ATTNPLAN_CACHE_DIR:-$BUILD/cache}"
status=0

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
if ! { cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNPLAN_WERROR=ON &&
       ninja -C "$BUILD"; } >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  exit 1
fi

echo "== GPU tests"
"$BUILD/tests/test_gpu" -r compact >"$OUT/test_gpu.log" 2>&1 || status=1
tail -5 "$OUT/test_gpu.log"

echo "== attnplan verify, every plan"
for plan in "$ROOT"/plans/*.json; do
  "$BUILD/attnplan" verify "$plan" --tokens 1000 --seqs 4 --prefix 300 >>"$OUT/verify.log" 2>&1
  code=$?
  printf '%-28s %s\n' "$(basename "$plan")" "$([[ $code == 0 ]] && echo ok || echo "FAILED ($code)")"
  [[ $code == 0 ]] || status=1
done

echo "== HF transformers layers"
python3 "$ROOT/tools/hf_layer_check.py" "$BUILD/attnplan" "$BUILD/hf" >"$OUT/hf.log" 2>&1 || status=1
grep -E "attnplan vs|FAIL|Error|error" "$OUT/hf.log" | head -20

echo "== host tests"
(cd "$BUILD" && ctest -j 16 --output-on-failure -LE gpu >"$OUT/ctest.log" 2>&1) || status=1
tail -3 "$OUT/ctest.log"
exit $status
