#!/usr/bin/env python3
"""Host tests of tools/bench_peers.py's timing (no GPU, no torch: a stand-in torch module whose CUDA events read
a simulated GPU clock that each run advances): the warm-up runs for at least --warmup runs and at least
WARMUP_MS of work, sizes its batches from the time per run, does nothing when asked for neither,
time_ms reports the median, min and max of the timed runs only, a run that the host takes longer to
enqueue than the GPU takes to run is reported host-bound (a simulated host clock), and time_peer then times
CUDA graph replays of it instead (a stand-in graph that records the runs made while capturing), several runs
a graph where one replay a run is still host-bound, keeping the host-bound reading where the capture fails.

  python3 tests/tools/bench_peers_test.py
"""
import contextlib
import os
import sys
import types
import unittest


class Gpu:
    """The simulated device: `now` is its clock in ms; each run advances it by the run's duration."""
    now = 0.0


class Event:
    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = Gpu.now

    def synchronize(self):
        pass

    def elapsed_time(self, stop):
        return stop.at - self.at


class Graph:
    """A stand-in CUDA graph: the runs made while it captures are recorded, and replay() replays them."""
    capturing = None

    def __init__(self):
        self.runs = []

    def replay(self):
        """One launch's host time, then each captured run's GPU time."""
        Host.now += self.runs[0][0].replay_host_ms / 1e3
        for run, s in self.runs:
            run.replay(s)


@contextlib.contextmanager
def capture(graph, pool=None):
    Graph.capturing = graph
    try:
        yield
    finally:
        Graph.capturing = None


def install_fake_torch():
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None, CUDAGraph=Graph, graph=capture,
                                       graph_pool_handle=lambda: "pool")
    nn = types.ModuleType("torch.nn")
    functional = types.ModuleType("torch.nn.functional")
    attention = types.ModuleType("torch.nn.attention")
    attention.SDPBackend = types.SimpleNamespace(CUDNN_ATTENTION="cudnn", FLASH_ATTENTION="flash")
    attention.sdpa_kernel = lambda backend: contextlib.nullcontext()
    torch.nn = nn
    nn.functional = functional
    nn.attention = attention
    sys.modules.update({"torch": torch, "torch.nn": nn, "torch.nn.functional": functional,
                        "torch.nn.attention": attention})


install_fake_torch()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import bench_peers  # noqa: E402


class Host:
    """The simulated host: `now` is its clock in seconds (bench_peers.host_clock reads it)."""
    now = 0.0


bench_peers.host_clock = lambda: Host.now


class Runs:
    """A peer's run: records which set it got and advances the GPU clock by `ms` (or ms(i) for run i) and the
    host's by `host_ms`. Called while a Graph captures, it is recorded instead (or raises, with
    `capturable=False`); a replay of it advances the GPU clock by `ms`, and the replay of a graph holding it
    the host's by `replay_host_ms` (once a graph, however many runs it holds)."""

    def __init__(self, ms, host_ms=0.0, replay_host_ms=0.004, capturable=True):
        self.ms = ms
        self.host_ms = host_ms
        self.replay_host_ms = replay_host_ms
        self.capturable = capturable
        self.sets = []
        self.replayed = []

    def __call__(self, s):
        if Graph.capturing is not None:
            if not self.capturable:
                raise RuntimeError("operation not permitted when stream is capturing\nmore detail")
            Graph.capturing.runs.append((self, s))
            return
        duration = self.ms(len(self.sets)) if callable(self.ms) else self.ms
        self.sets.append(s)
        Gpu.now += duration
        Host.now += self.host_ms / 1e3

    def replay(self, s):
        self.replayed.append(s)
        Gpu.now += self.ms if not callable(self.ms) else self.ms(len(self.sets))


class WarmUpTest(unittest.TestCase):
    def setUp(self):
        Gpu.now = 0.0

    def test_runs_for_the_time_asked(self):
        run = Runs(2.0)
        bench_peers.warm_up(run, ["a", "b", "c"], warmup=5, warmup_ms=300.0)
        self.assertGreaterEqual(Gpu.now, 300.0)
        self.assertLess(Gpu.now, 300.0 + 2 * 2.0)  # sized from the time per run: no batch overshoots much
        self.assertEqual(len(run.sets), 150)
        self.assertEqual(run.sets[:4], ["a", "b", "c", "a"])  # rotating through the sets

    def test_at_least_the_runs_asked(self):
        run = Runs(100.0)  # long runs: the run count, not the time, is the bound
        bench_peers.warm_up(run, [0], warmup=5, warmup_ms=300.0)
        self.assertEqual(len(run.sets), 5)

    def test_nothing_when_asked_for_nothing(self):
        run = Runs(1.0)
        bench_peers.warm_up(run, [0], warmup=0, warmup_ms=0.0)
        self.assertEqual(run.sets, [])

    def test_a_slow_first_run_does_not_cut_the_warm_up_short(self):
        run = Runs(lambda i: 50.0 if i == 0 else 1.0)  # a cold first run (JIT, caches)
        bench_peers.warm_up(run, [0], warmup=1, warmup_ms=300.0)
        self.assertGreaterEqual(Gpu.now, 300.0)

    def test_runs_too_short_to_time_still_end(self):
        run = Runs(0.0)  # events that read 0 ms cannot size a batch: the run count alone bounds it
        bench_peers.warm_up(run, [0], warmup=5, warmup_ms=1.0)
        self.assertGreaterEqual(len(run.sets), 5)

    def test_the_default_is_the_documented_300_ms(self):
        self.assertEqual(bench_peers.WARMUP_MS, 300.0)


class TimeTest(unittest.TestCase):
    def test_median_min_max_of_the_timed_runs_only(self):
        Gpu.now = 0.0
        # 1 ms per run until the warm-up's 300 ms are done, then the timed runs' own times
        timed = [3.0, 1.0, 2.0, 3.0, 1.0]
        warm = []

        def ms(i):
            if Gpu.now < bench_peers.WARMUP_MS:
                warm.append(i)
                return 1.0
            return timed[i - len(warm)]

        run = Runs(ms)
        result = bench_peers.time_ms(run, [0], iterations=5, warmup=5)
        self.assertEqual(len(run.sets), len(warm) + 5)
        self.assertEqual(result, {"median_ms": 2.0, "min_ms": 1.0, "max_ms": 3.0})


class HostBoundTest(unittest.TestCase):
    def setUp(self):
        Gpu.now = 0.0
        Host.now = 0.0

    def test_a_run_the_host_enqueues_slower_than_the_gpu_runs_is_host_bound(self):
        timing = bench_peers.time_ms(Runs(0.025, host_ms=0.040), [0], iterations=5, warmup=0)
        self.assertAlmostEqual(timing["host_ms"], 0.040)
        result = bench_peers.with_rate(timing, 1e9, "enable_gqa")
        self.assertTrue(result["note"].startswith("enable_gqa; host-bound: Python took 0.040 ms"), result["note"])

    def test_a_run_the_gpu_takes_longer_over_is_not(self):
        timing = bench_peers.time_ms(Runs(0.300, host_ms=0.040), [0], iterations=5, warmup=0)
        self.assertNotIn("host_ms", timing)
        self.assertEqual(bench_peers.with_rate(timing, 1e9, "enable_gqa")["note"], "enable_gqa")


class GraphReplayTest(unittest.TestCase):
    def setUp(self):
        Gpu.now = 0.0
        Host.now = 0.0

    def test_a_host_bound_run_is_timed_again_as_graph_replays(self):
        run = Runs(0.025, host_ms=0.040)
        timing = bench_peers.time_peer(run, ["a", "b"], iterations=5, warmup=0)
        self.assertTrue(timing["graph"])
        self.assertAlmostEqual(timing["eager_host_ms"], 0.040)
        self.assertNotIn("host_ms", timing)  # a replay enqueues in 0.004 ms: the GPU time is the kernels'
        self.assertAlmostEqual(timing["median_ms"], 0.025)
        self.assertEqual(run.replayed[:4], ["a", "b", "a", "b"])  # one graph per set, rotating
        note = bench_peers.with_rate(timing, 1e9, "enable_gqa")["note"]
        self.assertEqual(note, "enable_gqa; CUDA graph replays: Python took 0.040 ms to enqueue an eager run, "
                               "longer than its kernels")

    def test_a_run_that_cannot_be_captured_keeps_its_host_bound_reading(self):
        timing = bench_peers.time_peer(Runs(0.025, host_ms=0.040, capturable=False), [0], iterations=5, warmup=0)
        self.assertNotIn("graph", timing)
        self.assertAlmostEqual(timing["host_ms"], 0.040)
        note = bench_peers.with_rate(timing, 1e9, "torch.matmul")["note"]
        self.assertTrue(note.startswith("torch.matmul; no graph capture (operation not permitted when stream is "
                                        "capturing); host-bound: Python took 0.040 ms"), note)

    def test_replays_host_bound_at_one_run_each_replay_several(self):
        run = Runs(0.002, host_ms=0.040, replay_host_ms=0.010)
        timing = bench_peers.time_peer(run, ["a", "b", "c"], iterations=5, warmup=0)
        self.assertTrue(timing["graph"])
        self.assertEqual(timing["runs_per_graph"], 10)  # 2 x 0.010 ms of enqueue over 0.002 ms a run
        self.assertNotIn("host_ms", timing)
        self.assertAlmostEqual(timing["median_ms"], 0.002)  # per run
        # Replayed in turn, the graphs continue the rotation: no run follows one of its own set.
        replayed = run.replayed[-50:]  # the 5 timed replays
        self.assertTrue(all(a != b for a, b in zip(replayed, replayed[1:])), replayed)
        note = bench_peers.with_rate(timing, 1e9, "enable_gqa")["note"]
        self.assertEqual(note, "enable_gqa; CUDA graph replays of 10 runs each: Python took 0.040 ms to enqueue "
                               "an eager run, longer than its kernels")

    def test_replays_still_host_bound_at_the_most_runs_a_graph_say_so(self):
        timing = bench_peers.time_peer(Runs(0.0005, host_ms=0.040, replay_host_ms=0.010), [0], iterations=5,
                                       warmup=0)
        self.assertTrue(timing["graph"])
        self.assertEqual(timing["runs_per_graph"], bench_peers.MAX_RUNS_PER_GRAPH)
        self.assertAlmostEqual(timing["host_ms"], 0.010 / bench_peers.MAX_RUNS_PER_GRAPH)  # per run
        self.assertAlmostEqual(timing["median_ms"], 0.0005)
        self.assertIn("host-bound", bench_peers.with_rate(timing, 1e9)["note"])

    def test_a_run_the_gpu_takes_longer_over_is_not_captured(self):
        run = Runs(0.300, host_ms=0.040, capturable=False)  # a capture would raise
        timing = bench_peers.time_peer(run, [0], iterations=5, warmup=0)
        self.assertEqual(set(timing), {"median_ms", "min_ms", "max_ms"})
        self.assertEqual(run.replayed, [])


if __name__ == "__main__":
    unittest.main()
