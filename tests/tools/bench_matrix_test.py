#!/usr/bin/env python3
"""Host tests of tools/bench_matrix.py (the suite's rows and table; no torch, no GPU): the window and quantized
rows, a refused plan's note, the layer row's agreement gate, --only bringing back a window row's baseline, and
the llama3 RoPE frequencies the eager layer uses; and of tools/ab_bench.sh's variants and its --trace, run end
to end with stand-in attnplans.

  python3 tests/tools/bench_matrix_test.py
"""
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import bench_matrix  # noqa: E402


def make_rows(directory, only=""):
    with contextlib.redirect_stdout(io.StringIO()) as runs:
        bench_matrix.make_rows(directory, False, only)
    with open(os.path.join(directory, "rows.json")) as f:
        return json.load(f), runs.getvalue().splitlines()


def write_ours(directory, run_id, stages):
    """stages: name -> (median ms, flops) or (median ms, flops, min ms); the minimum defaults to the median."""
    os.makedirs(os.path.join(directory, "ours"), exist_ok=True)
    with open(os.path.join(directory, "ours", run_id + ".json"), "w") as f:
        json.dump({"chunk_lens": stages.pop("chunk_lens"),
                   "rows": [{"stage": name, "median_ms": ms, "min_ms": (rest or [ms])[0], "flops": flops,
                             "tflops": flops / ms / 1e9}
                            for name, (ms, flops, *rest) in stages.items()]}, f)


def table(directory):
    header = os.path.join(directory, "header.txt")
    with open(header, "w") as f:
        f.write("GPU: test\n")
    with contextlib.redirect_stdout(io.StringIO()):
        status = bench_matrix.table(directory, header)
    with open(os.path.join(directory, "bench.json")) as f:
        return status, {row["id"] + "|" + row["peer"]: row for row in json.load(f)["rows"]}


class Rows(unittest.TestCase):
    def test_window_and_quantized_rows(self):
        with tempfile.TemporaryDirectory() as directory:
            rows, runs = make_rows(directory)
            ids = {row["id"]: row for row in rows}
            window, full = ids["win-d128-w4k-32k"], ids["win-d128-full-32k"]
            self.assertEqual(window["versus"], "win-d128-full-32k")
            with open(window["config"]) as f:
                config = json.load(f)
            self.assertEqual((config["sliding_window"], config["max_tokens"]), (4096, 32768))
            with open(full["config"]) as f:
                self.assertNotIn("sliding_window", json.load(f))
            for model in bench_matrix.QUANTIZED_MODELS:
                for tokens in bench_matrix.QUANTIZED_TOKENS:
                    self.assertIn(f"proj-{model}-o-{tokens}", ids)
                    self.assertTrue(any(line.startswith(f"proj-{model}-qkv-{tokens} ") for line in runs))
            self.assertEqual(ids["proj-Qwen3-8B-fp8-block-qkv-512"]["format"], "fp8 block, bf16 act")
            self.assertEqual(ids["proj-Qwen3-8B-fp8-block-fp8act-qkv-512"]["format"], "fp8 block, fp8 act")
            self.assertEqual(ids["proj-Llama-3.1-8B-awq-qkv-512"]["format"], "packed_integer awq 4 128")
            self.assertEqual(ids["proj-Llama-3.1-8B-awq-qkv-512"]["n"], 6144)
            self.assertEqual(len(runs), len({line.split()[0] for line in runs}))  # one run per id

    def test_bare_qkv_rows(self):
        # Beside each fused q|k|v row at 8k, the same shape from a copy of the plan with nothing to fuse.
        with tempfile.TemporaryDirectory() as directory:
            rows, runs = make_rows(directory, "proj-.*-qkv-(bare-)?8192")
            ids = {row["id"]: row for row in rows}
            for model in [*bench_matrix.PROJECTION_MODELS, *bench_matrix.QUANTIZED_MODELS]:
                fused, bare = ids[f"proj-{model}-qkv-8192"], ids[f"proj-{model}-qkv-bare-8192"]
                self.assertTrue(bare["bare"])
                self.assertNotIn("bare", fused)
                self.assertEqual((bare["m"], bare["n"], bare["k"], bare["stage"]),
                                 (fused["m"], fused["n"], fused["k"], fused["stage"]))
                self.assertNotEqual(bare["config"], fused["config"])
                self.assertEqual(bare["format"], fused["format"])
                with open(bare["config"]) as f:
                    config = json.load(f)
                with open(fused["config"]) as f:
                    original = json.load(f)
                self.assertEqual(config["rotary"], {"dim": 0})
                self.assertNotIn("qkv_norm", config)
                self.assertEqual({k: v for k, v in config.items() if k not in ("rotary", "qkv_norm")},
                                 {k: v for k, v in original.items() if k not in ("rotary", "qkv_norm")})
                self.assertTrue(any(line.startswith(f"proj-{model}-qkv-bare-8192 {bare['config']} ")
                                    for line in runs))
            with open(ids["proj-Qwen3-32B-qkv-8192"]["config"]) as f:
                self.assertIn("qkv_norm", json.load(f))

    def test_only_brings_back_the_window_baseline(self):
        with tempfile.TemporaryDirectory() as directory:
            rows, runs = make_rows(directory, "win-d128-w4k")
            self.assertEqual(sorted(row["id"] for row in rows), ["win-d128-full-32k", "win-d128-w4k-32k"])
            self.assertEqual(len(runs), 2)


class Table(unittest.TestCase):
    def setUp(self):
        self.directory = tempfile.TemporaryDirectory()
        d = self.directory.name
        make_rows(d, "win|proj-Llama-3.1-8B-awq-qkv-512|proj-Llama-3.1-8B-mlx-4bit-qkv-512|layer")
        write_ours(d, "win-d128-w4k-32k", {"chunk_lens": [32768], "attention": (6.0, 1.0e12)})
        # A median 15% above its minimum (the bimodal long rows): the note gives the minimum.
        write_ours(d, "win-d128-full-32k", {"chunk_lens": [32768], "attention": (40.0, 8.0e12, 34.8)})
        write_ours(d, "proj-Llama-3.1-8B-awq-qkv-512", {"chunk_lens": [512], "qkv_projection": (0.05, 2.6e10),
                                                         "output_projection": (0.04, 1.7e10)})
        write_ours(d, "proj-Llama-3.1-8B-qkv-8192", {"chunk_lens": [8192], "input_norm": (0.05, 0.0),
                                                      "qkv_projection": (0.5, 4.0e11), "layer": (3.0, 1e12),
                                                      "layer_graph": (2.9, 1e12)})
        with open(os.path.join(d, "ours", "proj-Llama-3.1-8B-mlx-4bit-qkv-512.log"), "w") as f:
            f.write("attnplan: config error\n  /projection/format: affine not supported by the kernels yet (x)\n")
        self.peers = {"proj-Llama-3.1-8B-awq-qkv-512": {"cublas_bf16": {"median_ms": 0.06, "min_ms": 0.05,
                                                                          "tflops": 400}},
                      "layer-Llama-3.1-8B-8k": {"eager": {"median_ms": 4.0, "tflops": 200,
                                                          "agreement": {"rel_l2": 3e-3, "bf16_rel_l2": 4e-3}},
                                                "eager_stages": {"median_ms": 2.7, "tflops": 370,
                                                                 "note": "sum of the eager stages' medians"}}}

    def tearDown(self):
        self.directory.cleanup()

    def write_peers(self):
        with open(os.path.join(self.directory.name, "peers.json"), "w") as f:
            json.dump({"rows": [{"id": k, "peers": v} for k, v in self.peers.items()]}, f)

    def test_rows(self):
        self.write_peers()
        status, rows = table(self.directory.name)
        self.assertEqual(status, 0)
        window = rows["win-d128-w4k-32k|ours, no window"]
        self.assertAlmostEqual(window["ours_over_peer"], 40.0 / 6.0)
        self.assertIn("window/full time 0.150 vs allowed pairs window/full 0.125", window["note"])
        self.assertIn("window/sequence 0.125", window["note"])
        awq = rows["proj-Llama-3.1-8B-awq-qkv-512|cublas_bf16"]
        self.assertAlmostEqual(awq["ours_over_peer"], 0.06 / 0.05)
        # Spread notes: only where a median lies more than 5% above its minimum, for either side.
        self.assertIn("peer min 0.050 ms (median +20%)", awq["note"])
        self.assertNotIn("ours min", awq["note"])
        self.assertNotIn("norms and RoPE", awq["note"])  # no fused-epilogue mark on its stage
        self.assertIn("ours min 34.800 ms (median +15%)", rows["win-d128-full-32k|none"]["note"])
        # The window row's peer is that same full-causal run.
        self.assertIn("peer min 34.800 ms", window["note"])
        self.assertNotIn("ours min", window["note"])
        self.assertNotIn("proj-Llama-3.1-8B-awq-qkv-512|scaled_mm_fp8", rows)
        refused = rows["proj-Llama-3.1-8B-mlx-4bit-qkv-512|cublas_bf16"]
        self.assertIsNone(refused["ours"])
        self.assertIn("refused at planning: /projection/format: affine not supported", refused["note"])
        self.assertIn("rel L2 3.0e-03", rows["layer-Llama-3.1-8B-8k (graph)|eager"]["note"])
        # Issue 6's second layer target: against the sum of the stages' peers, the 15% bound in the note.
        stages = rows["layer-Llama-3.1-8B-8k|eager_stages"]
        self.assertAlmostEqual(stages["ours_over_peer"], 2.7 / 3.0)
        self.assertIn("within 15% of the sum (ours/peer >= 0.87)", stages["note"])
        self.assertNotIn("rel L2", stages["note"])
        # The layer's stages follow it, ours only: a memory-bound one with its GB/s, a GEMM with TFLOP/s.
        norm = rows["layer-Llama-3.1-8B-8k / input_norm|none"]
        self.assertAlmostEqual(norm["ours"]["median_ms"], 0.05)
        self.assertIn("stage of the layer row", norm["note"])
        self.assertIn("800.0 TFLOP/s", rows["layer-Llama-3.1-8B-8k / qkv_projection|none"]["note"])
        self.assertNotIn("layer-Llama-3.1-8B-8k / layer|none", rows)

    def test_layer_disagreement_fails(self):
        self.peers["layer-Llama-3.1-8B-8k"]["eager"]["agreement"]["rel_l2"] = 2e-2
        self.write_peers()
        status, rows = table(self.directory.name)
        self.assertEqual(status, 1)
        self.assertIn("DISAGREES", rows["layer-Llama-3.1-8B-8k|eager"]["note"])

    def test_layer_check_not_run_fails(self):
        del self.peers["layer-Llama-3.1-8B-8k"]["eager"]["agreement"]
        self.peers["layer-Llama-3.1-8B-8k"]["eager"]["agreement_error"] = "RuntimeError: attnplan run exited 2"
        self.write_peers()
        status, rows = table(self.directory.name)
        self.assertEqual(status, 1)
        self.assertIn("NOT checked: RuntimeError", rows["layer-Llama-3.1-8B-8k|eager"]["note"])

    def test_fused_postprocess_is_noted(self):
        # attnplan bench marks a q|k|v stage that ran the norms and RoPE in its epilogue; its row says the
        # peers do less. The o row of the same run says nothing of it.
        d = self.directory.name
        make_rows(d, "proj-Llama-3.1-8B-(qkv|o)-8192")
        with open(os.path.join(d, "ours", "proj-Llama-3.1-8B-qkv-8192.json"), "w") as f:
            json.dump({"chunk_lens": [8192], "rows": [
                {"stage": "qkv_projection", "kernel": "qkv_projection " + bench_matrix.FUSED_POSTPROCESS,
                 "median_ms": 0.58, "min_ms": 0.58, "flops": 4.1e11, "tflops": 708.0},
                {"stage": "output_projection", "kernel": "output_projection", "median_ms": 0.38, "min_ms": 0.38,
                 "flops": 2.7e11, "tflops": 723.0}]}, f)
        self.write_peers()
        status, rows = table(d)
        self.assertEqual(status, 0)
        for peer in ("cublas_bf16", "scaled_mm_fp8"):
            self.assertIn("ours includes the q/k/v norms and RoPE", rows[f"proj-Llama-3.1-8B-qkv-8192|{peer}"]["note"])
            self.assertNotIn("norms and RoPE", rows[f"proj-Llama-3.1-8B-o-8192|{peer}"]["note"])

    def test_bare_row_is_noted_and_checked(self):
        # The bare row says what it times; a bare run whose stage still fused the postprocess fails the table.
        d = self.directory.name
        make_rows(d, "proj-Llama-3.1-8B-qkv-bare-8192")
        for kernel, expected_status in (("qkv_projection", 0),
                                        ("qkv_projection " + bench_matrix.FUSED_POSTPROCESS, 1)):
            with open(os.path.join(d, "ours", "proj-Llama-3.1-8B-qkv-bare-8192.json"), "w") as f:
                json.dump({"chunk_lens": [8192], "rows": [
                    {"stage": "qkv_projection", "kernel": kernel, "median_ms": 0.57, "min_ms": 0.57,
                     "flops": 4.1e11, "tflops": 720.0}]}, f)
            self.write_peers()
            status, rows = table(d)
            self.assertEqual(status, expected_status)
            note = rows["proj-Llama-3.1-8B-qkv-bare-8192|cublas_bf16"]["note"]
            self.assertIn(bench_matrix.BARE_NOTE, note)
            self.assertNotIn("ours includes the q/k/v norms", note)


class AB(unittest.TestCase):
    """tools/ab_bench.sh's table: round medians per variant, their median, the minimum, the time ratio."""

    def write_round(self, directory, name, run_id, index, stages):
        os.makedirs(os.path.join(directory, name), exist_ok=True)
        with open(os.path.join(directory, name, f"{run_id}.r{index}.json"), "w") as f:
            json.dump({"rows": [{"stage": stage, "median_ms": ms, "min_ms": low} for stage, (ms, low) in
                                stages.items()]}, f)

    def test_variants_side_by_side(self):
        with tempfile.TemporaryDirectory() as directory:
            make_rows(directory, "attn-d64-causal-16k-s1-b64|proj-Llama-3.1-8B-o-8192")
            for index, (main_ms, old_ms) in enumerate([(2.6, 2.4), (2.7, 2.5), (2.5, 2.45)], start=1):
                self.write_round(directory, "main", "attn-d64-causal-16k-s1-b64", index,
                                 {"attention": (main_ms, main_ms - 0.1)})
                self.write_round(directory, "old", "attn-d64-causal-16k-s1-b64", index,
                                 {"attention": (old_ms, old_ms - 0.2)})
            # The o row shares the q|k|v row's run; the old variant has no result for it.
            self.write_round(directory, "main", "proj-Llama-3.1-8B-qkv-8192", 1,
                             {"output_projection": (0.35, 0.34), "qkv_projection": (0.52, 0.5)})
            lines, status = bench_matrix.ab_table(directory, ["main", "old"])
        self.assertEqual(status, 1)
        self.assertEqual(lines[0], "| row | stage | main ms (rounds; min) | old ms (rounds; min) | old / main |")
        attention = next(line for line in lines if line.startswith("| attn-d64"))
        self.assertEqual(attention, "| attn-d64-causal-16k-s1-b64 | attention | 2.600 (2.600, 2.700, 2.500; 2.400) | "
                                    "2.450 (2.400, 2.500, 2.450; 2.200) | 0.942 |")
        projection = next(line for line in lines if line.startswith("| proj-Llama-3.1-8B-o-8192"))
        self.assertEqual(projection, "| proj-Llama-3.1-8B-o-8192 | output_projection | 0.350 (0.350; 0.340) | "
                                     "no result |  |")

    def test_layer_row_lists_each_stage(self):
        # A layer row shows the layer's own stages first, in the variants' order, then the layer itself; a
        # stage only one variant runs (a fusion removed it from the other) is "(none)" there and no failure.
        with tempfile.TemporaryDirectory() as directory:
            make_rows(directory, "layer")
            run_id = "proj-Llama-3.1-8B-qkv-8192"  # the layer row's shared run
            self.write_round(directory, "main", run_id, 1, {"qkv_projection": (0.61, 0.60), "layer": (2.10, 2.09),
                                                            "layer_graph": (2.15, 2.14)})
            self.write_round(directory, "old", run_id, 1, {"qkv_projection": (0.58, 0.57),
                                                           "qkv_postprocess": (0.057, 0.056),
                                                           "layer": (2.12, 2.11), "layer_graph": (2.16, 2.15)})
            lines, status = bench_matrix.ab_table(directory, ["main", "old"])
        self.assertEqual(status, 0)
        stages = [line.split(" | ")[1] for line in lines[2:]]
        self.assertEqual(stages, ["qkv_projection", "qkv_postprocess", "layer", "layer_graph"])
        postprocess = next(line for line in lines if " | qkv_postprocess | " in line)
        self.assertIn("| (none) | 0.057 (0.057; 0.056) |", postprocess)


def bench_json(output_ms, output_min_ms):
    """A stand-in `attnplan bench --json` of the q|k|v-8192 run, whose o stage the o row reads."""
    return json.dumps({"rows": [{"stage": "qkv_projection", "median_ms": 0.6, "min_ms": 0.6},
                                {"stage": "output_projection", "median_ms": output_ms, "min_ms": output_min_ms}]})


def stand_in_build(directory, name, script):
    """A build directory whose attnplan is the shell `script`, in a build.ninja where it is up to date, so
    tools/ab_bench.sh's build_attnplan leaves it alone."""
    build = os.path.join(directory, name)
    os.makedirs(build)
    with open(os.path.join(build, "attnplan"), "w") as f:
        f.write("#!/bin/sh\n" + script)
    os.chmod(os.path.join(build, "attnplan"), 0o755)
    with open(os.path.join(build, "build.ninja"), "w") as f:
        f.write("build attnplan: phony\n")
    return build


class ABScript(unittest.TestCase):
    """tools/ab_bench.sh end to end with stand-in attnplans (no GPU): the build's own binary, a template
    directory (ATTNPLAN_TEMPLATE_DIR set for it), a source tree (NAME=TREE: built first, its binary run) and
    the tree's binary with the template directory (NAME=TREE:DIR)."""

    def test_build_template_dir_and_tree_variants(self):
        tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
        with tempfile.TemporaryDirectory() as directory:
            # The build: an attnplan that answers 0.40 ms, or 0.30 under a template directory.
            build = stand_in_build(directory, "build",
                                   f"if [ -n \"$ATTNPLAN_TEMPLATE_DIR\" ]; then echo '{bench_json(0.30, 0.30)}'; "
                                   f"else echo '{bench_json(0.40, 0.40)}'; fi\n")
            templates = os.path.join(directory, "templates")
            os.makedirs(templates)
            # The tree: a CMake project whose attnplan answers 0.20 ms, or 0.10 under a template directory.
            tree = os.path.join(directory, "tree")
            os.makedirs(tree)
            with open(os.path.join(tree, "CMakeLists.txt"), "w") as f:
                f.write("cmake_minimum_required(VERSION 3.20)\nproject(stand_in CXX)\n"
                        "option(ATTNPLAN_WERROR \"\" OFF)\nadd_executable(attnplan main.cpp)\n")
            with open(os.path.join(tree, "main.cpp"), "w") as f:
                f.write("#include <cstdio>\n#include <cstdlib>\n"
                        "int main() { std::puts(std::getenv(\"ATTNPLAN_TEMPLATE_DIR\") ? "
                        f"{json.dumps(bench_json(0.10, 0.10))} : {json.dumps(bench_json(0.20, 0.19))}); "
                        "return 0; }\n")
            out = os.path.join(directory, "out")
            environment = dict(os.environ, OUT=out, ATTNPLAN_BUILD_DIR=build,
                               ATTNPLAN_CACHE_DIR=os.path.join(directory, "cache"), ATTNPLAN_COMMIT="test")
            result = subprocess.run(
                ["bash", os.path.join(tools, "ab_bench.sh"), "--rounds", "1", "--iterations", "1", "--only",
                 "proj-Llama-3.1-8B-o-8192", "main", "dir=" + templates, "tree=" + tree,
                 "treedir=" + tree + ":" + templates],
                env=environment, capture_output=True, text=True, timeout=120)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertTrue(os.access(os.path.join(tree, "build-gpu", "attnplan"), os.X_OK))
            with open(os.path.join(out, "ab.md")) as f:
                row = next(line for line in f if line.startswith("| proj-Llama-3.1-8B-o-8192 |"))
        self.assertEqual(row, "| proj-Llama-3.1-8B-o-8192 | output_projection | 0.400 (0.400; 0.400) | "
                              "0.300 (0.300; 0.300) | 0.200 (0.200; 0.190) | 0.100 (0.100; 0.100) | "
                              "0.750 | 0.500 | 0.250 |\n")


class ABTrace(unittest.TestCase):
    """tools/ab_bench.sh --trace with stand-in attnplans: a build that writes a trace where `--trace-attention`
    asks (the synthetic one of attention_trace_test.py) and one that refuses the option, as an older tree's
    would."""

    def test_trace_summaries(self):
        tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import attention_trace_test  # noqa: E402
        row = json.dumps({"rows": [{"stage": "attention", "median_ms": 0.25, "min_ms": 0.25}]})
        with tempfile.TemporaryDirectory() as directory:
            prepared = os.path.join(directory, "prepared.json")
            with open(prepared, "w") as f:
                json.dump(attention_trace_test.trace(), f)
            builds = {}
            for name, on_trace in (("new", f'cp {prepared} "$out"'),
                                   ("old", "echo 'unknown option --trace-attention' >&2; exit 1")):
                builds[name] = stand_in_build(
                    directory, name,
                    "out=''; previous=''\n"
                    'for argument in "$@"; do [ "$previous" = --trace-attention ] && out="$argument"; '
                    'previous="$argument"; done\n'
                    f'if [ -n "$out" ]; then {on_trace}; fi\n'
                    f"echo '{row}'\n")
            out = os.path.join(directory, "out")
            environment = dict(os.environ, OUT=out, ATTNPLAN_BUILD_DIR=builds["new"],
                               ATTNPLAN_CACHE_DIR=os.path.join(directory, "cache"), ATTNPLAN_COMMIT="test")
            result = subprocess.run(
                ["bash", os.path.join(tools, "ab_bench.sh"), "--rounds", "1", "--iterations", "1", "--trace",
                 "--only", "attn-d128-causal-4k-s1-b64", "main", "old=" + builds["old"]],
                env=environment, capture_output=True, text=True, timeout=120)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            with open(os.path.join(out, "ab-trace.md")) as f:
                traces = f.read()
            self.assertTrue(os.path.exists(os.path.join(out, "ab", "main", "attn-d128-causal-4k-s1-b64.trace.json")))
        main, old = traces.split("== old attn-d128-causal-4k-s1-b64\n")
        self.assertTrue(main.startswith("== main attn-d128-causal-4k-s1-b64\n"))
        self.assertIn("consumer warpgroup, per unit", main)
        self.assertIn("no trace: unknown option --trace-attention", old)


class Rope(unittest.TestCase):
    def test_llama3_scaling(self):
        with open(os.path.join(bench_matrix.ROOT, "plans", "llama-3.1-8b.json")) as f:
            config = json.load(f)
        scaled = bench_matrix.rope_inv_freq(config)
        plain = [1.0 / 500000 ** (i / 128) for i in range(0, 128, 2)]
        self.assertEqual(len(scaled), 64)
        self.assertEqual(scaled[0], plain[0])  # wavelength 2 pi < 8192 / 4: unchanged
        self.assertAlmostEqual(scaled[-1], plain[-1] / 8)  # wavelength > 8192: divided by the factor
        middle = [i for i, f in enumerate(plain) if 8192 / 4 <= 2 * math.pi / f <= 8192]
        self.assertTrue(middle)
        for i in middle:  # interpolated between the two
            self.assertTrue(plain[i] / 8 <= scaled[i] <= plain[i])

    def test_unscaled_and_refused(self):
        self.assertEqual(bench_matrix.rope_inv_freq({"hidden_size": 64, "query_heads": 2, "rotary": {"theta": 100}}),
                         [1.0 / 100 ** (i / 32) for i in range(0, 32, 2)])
        with self.assertRaises(ValueError):
            bench_matrix.rope_inv_freq({"hidden_size": 64, "query_heads": 2, "rotary": {"dim": 16}})


if __name__ == "__main__":
    unittest.main()
