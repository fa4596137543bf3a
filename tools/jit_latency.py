#!/usr/bin/env python3
"""JIT latency of `attnplan compile`, measured the way a user pays for it: whole processes.

cold: every kernel of the config compiled from an empty cache (wall time of the process, and each
      kernel's NVRTC time from --json);
warm: the same command again with everything cached (the whole process: start, config, cache
      lookups, exit), median of --warm-runs.

Prints a Markdown section (machine, date, commit, NVRTC version, the table) for docs/performance.md,
and exits 1 when a target of the JIT-latency issue is missed (cold <= 10 s, warm <= 100 ms).

  tools/jit_latency.py [--cli build/attnplan] [--config plans/llama-3.1-8b.json] [--warm-runs 10]
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLD_TARGET_S = 10.0
WARM_TARGET_MS = 100.0


def timed_compile(cli, config, cache_dir, arch):
    """Runs `attnplan compile --json` once; returns (wall seconds, parsed JSON)."""
    command = [str(cli), "compile", str(config), "--json", "--cache-dir", str(cache_dir)]
    if arch:
        command += ["--arch", arch]
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"jit_latency: {' '.join(command)} exited {done.returncode}:\n{done.stderr}")
    return wall, json.loads(done.stdout)


def median_process_ms(command, runs):
    """Median wall time of `command` over `runs` processes, in ms."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def command_output(command, default="unknown"):
    try:
        return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              check=True, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return default


def nvrtc_version(cli):
    # doctor exits 2 when compiling would fail, but its JSON still says which NVRTC it found.
    done = subprocess.run([str(cli), "doctor", "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True)
    try:
        return json.loads(done.stdout)["nvrtc"]["version"]
    except (ValueError, KeyError, TypeError):
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cli", default=ROOT / "build" / "attnplan", type=Path, help="the attnplan binary")
    parser.add_argument("--config", default=ROOT / "plans" / "llama-3.1-8b.json", type=Path)
    parser.add_argument("--arch", default="", help="passed to compile --arch (default: the CLI's auto)")
    parser.add_argument("--warm-runs", default=10, type=int)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="attnplan-jit-latency.") as scratch:
        cache_dir = Path(scratch) / "cache"
        cold_s, cold = timed_compile(args.cli, args.config, cache_dir, args.arch)
        misses = [kernel for kernel in cold["kernels"] if kernel["cache"] == "miss"]
        if len(misses) != len(cold["kernels"]):
            sys.exit("jit_latency: the cold run found cached kernels; the cache was not empty")
        warm_ms = []
        for _ in range(args.warm_runs):
            seconds, warm = timed_compile(args.cli, args.config, cache_dir, args.arch)
            if any(kernel["cache"] == "miss" for kernel in warm["kernels"]):
                sys.exit("jit_latency: a warm run compiled a kernel; the cache did not keep it")
            warm_ms.append(seconds * 1000)

    # What any attnplan process costs before it does work (loading libnvrtc, fmt, libstdc++): the floor
    # under the warm number.
    floor_ms = median_process_ms([str(args.cli), "--help"], args.warm_runs)
    nvrtc_total_ms = sum(kernel["compile_ms"] for kernel in cold["kernels"])
    warm_median = statistics.median(warm_ms)
    print(f"- machine: {os.cpu_count()} cores (`nproc` {command_output(['nproc'])}), {cpu_model()}, "
          f"load average {os.getloadavg()[0]:.1f} at the start of the run, no GPU needed")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"commit {command_output(['git', 'rev-parse', '--short', 'HEAD'])}; NVRTC {nvrtc_version(args.cli)}")
    print(f"- config: {args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config}, "
          f"arch {cold['arch']}, {len(cold['kernels'])} kernels")
    print()
    print("| measurement | time | target |")
    print("| --- | ---: | ---: |")
    for kernel in cold["kernels"]:
        print(f"| cold: NVRTC compile of `{kernel['name']}` | {kernel['compile_ms']:.0f} ms | |")
    print(f"| cold: sum of the NVRTC compiles | {nvrtc_total_ms:.0f} ms | |")
    print(f"| cold: `attnplan compile`, whole process, empty cache | {cold_s:.2f} s | <= {COLD_TARGET_S:.0f} s |")
    print(f"| warm: `attnplan compile`, whole process, median of {len(warm_ms)} | {warm_median:.1f} ms "
          f"(min {min(warm_ms):.1f}, max {max(warm_ms):.1f}) | <= {WARM_TARGET_MS:.0f} ms |")
    print(f"| floor: `attnplan --help`, whole process, median of {args.warm_runs} | {floor_ms:.1f} ms | |")

    missed = []
    if cold_s > COLD_TARGET_S:
        missed.append(f"cold {cold_s:.2f} s > {COLD_TARGET_S:.0f} s")
    if warm_median > WARM_TARGET_MS:
        missed.append(f"warm {warm_median:.1f} ms > {WARM_TARGET_MS:.0f} ms")
    if missed:
        print(f"\njit_latency: target missed: {'; '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
