#!/usr/bin/env python3
"""Host tests of tools/attention_trace.py over a synthetic trace laid out as `attnplan bench
--trace-attention` writes it: the phases' medians, the launch's balance, the timeline, and a file that is
not a trace.

  python3 tests/tools/attention_trace_test.py
"""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import attention_trace  # noqa: E402

PRODUCER = ["begin", "first_tile_issued", "q_issued", "last_tile_issued", "next_claimed", "next_q_prefetched"]
CONSUMER = ["begin", "first_tile_landed", "first_softmax_done", "last_product_done", "stored",
            "next_handed_over"]


def role(number, units, start_clock, start_ns, steps):
    """A warpgroup at 2 cycles per ns that walks `units`, each event `steps[e]` cycles after the one before."""
    clock, records = start_clock, []
    for unit in units:
        clocks = []
        for step in steps:
            clock += step
            clocks.append(clock)
        records.append({"unit": unit, "clocks": clocks})
    end_clock = clock + 100
    return {"role": number, "sm": 0, "start_clock": start_clock, "end_clock": end_clock, "start_ns": start_ns,
            "end_ns": start_ns + (end_clock - start_clock) // 2, "units_walked": len(units), "units": records}


def trace():
    # Two CTAs, two units each; the consumers spend 2000 cycles (1 us) waiting for the first tile, 20000
    # (10 us) in the loop, 4000 (2 us) in the epilogue. CTA 1 starts 2.95 us later.
    consumer_steps = [200, 2000, 1000, 20000, 4000, 400]
    producer_steps = [100, 300, 300, 15000, 800, 200]
    ctas = []
    for cta, late in ((0, 0), (1, 2950)):
        units = [cta, 2 + cta]
        ctas.append({"cta": cta, "roles": [role(0, units, 1000, 1000 + late, producer_steps),
                                           role(1, units, 1000, 1000 + late, consumer_steps),
                                           role(2, units, 1000, 1000 + late, consumer_steps)]})
    return {"config": "attention-d128", "device": "H100", "tokens": 1024, "seqs": 1, "mask": "bidirectional",
            "block_size": 64, "kernels": ["attention"],
            "attention": {"head_dim": 128, "block_m": 128, "block_n": 128, "stages": 3, "warps": 12},
            "producer_events": PRODUCER, "consumer_events": CONSUMER,
            "launches": [{"dropped_units": 0, "ctas": ctas}]}


class AttentionTraceTest(unittest.TestCase):
    def summary(self, timeline=None):
        return attention_trace.summarize(trace(), timeline)

    def line(self, lines, start):
        found = [line for line in lines if line.strip().startswith(start)]
        self.assertEqual(len(found), 1, (start, lines))
        return found[0].split()

    def test_phases(self):
        lines = self.summary()
        self.assertIn("D 128, block_m 128, block_n 128, 3 stages, 2 consumer warpgroups", lines[0])
        self.assertEqual(self.line(lines, "wait for tile 0")[-4:], ["1.00", "1.00", "1.00", "8"])
        self.assertEqual(self.line(lines, "loop")[-4], "10.00")
        self.assertEqual(self.line(lines, "epilogue")[-4], "2.00")
        # The next unit's setup: from the hand-over to the next unit's begin, one per unit but the last.
        self.assertEqual(self.line(lines, "next unit's setup")[-4:], ["0.10", "0.10", "0.10", "4"])
        self.assertEqual(self.line(lines, "tiles after the first")[-4], "7.65")  # 300 + 15000 cycles
        # Outside the loop: a unit (27600 cycles to the next begin) less its loop (20000).
        self.assertIn("median 3.80 us", [line for line in lines if "outside the loop" in line][0])

    def test_launch(self):
        launch = [line for line in self.summary() if "launches" in line][0]
        self.assertIn("SM clock 2.00 GHz", launch)
        self.assertIn("2.0 units per CTA", launch)
        # Each CTA's consumers end 27.65 us after their start (2 x 27600 + 100 cycles), CTA 1's 2.95 us
        # after CTA 0's: the launch spans 30.6 us, its mean CTA ends at 29.125.
        self.assertIn("span 30.6 us", launch)
        self.assertIn("1.051 x the mean", launch)

    def test_timeline(self):
        lines = self.summary(timeline=1)
        consumer = [line for line in lines if line.strip().startswith("unit 3")]
        self.assertEqual(len(consumer), 3)  # the producer and two consumer warpgroups
        # CTA 1's first record is 2.95 us after the launch's start; unit 3 begins 27800 cycles later.
        self.assertIn("begin 16.85", consumer[1])
        self.assertIn("CTA 7 walked no unit", "\n".join(self.summary(timeline=7)))

    def test_not_a_trace(self):
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "bad.json")
            with open(path, "w") as handle:
                json.dump({"launches": []}, handle)
            with contextlib.redirect_stderr(io.StringIO()) as err:
                self.assertEqual(attention_trace.main([path]), 1)
            self.assertIn("not a trace", err.getvalue())
            good = os.path.join(directory, "good.json")
            with open(good, "w") as handle:
                json.dump(trace(), handle)
            with contextlib.redirect_stdout(io.StringIO()) as out:
                self.assertEqual(attention_trace.main([good]), 0)
            self.assertIn("consumer warpgroup, per unit", out.getvalue())


if __name__ == "__main__":
    unittest.main()
