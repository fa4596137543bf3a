#!/usr/bin/env python3
"""Host tests of tools/attention_balance.py (pure Python): the item numbering and costs follow the kernel's
(heaviest query tile first, items past a short chunk empty), each walk's load is what a hand count gives on a
small case, and the figures attention-notes.md "Session 39" and "Session 41" quote come out; --fit recovers
the tile and item costs that made a set of times (attention-notes.md "What an item's end costs").

  python3 tests/tools/attention_balance_test.py
"""
import contextlib
import io
import os
import sys
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import attention_balance  # noqa: E402


class ItemCostsTest(unittest.TestCase):
    def test_heaviest_query_tile_first_and_empty_items_past_a_short_chunk(self):
        # Two sequences of 300 and 100 tokens, 100 tokens per item, one head group, 128-key tiles: query
        # tiles [200, 300), [100, 200), [0, 100) of the long one; only [0, 100) of the short one.
        costs = attention_balance.item_costs([300, 100], 100, head_groups=1, overhead=0)
        self.assertEqual(costs, [3, None, 2, None, 1, 1])  # rows 299, -, 199, -, 99, 99: tiles 3, 2, 1, 1

    def test_bidirectional_items_cost_their_whole_sequence(self):
        costs = attention_balance.item_costs([300, 100], 100, head_groups=1, bidirectional=True, overhead=1)
        self.assertEqual(costs, [4, None, 4, None, 4, 2])

    def test_sequence_major_walks_the_longest_sequence_first(self):
        # The same batch, one span per chunk: the 300-token sequence's three tiles, then the 100-token one's
        # (its two tiles past the chunk empty), as plan::longest_first_sequences orders them; with two head
        # groups each sequence's tiles of the first group, then of the second.
        costs = attention_balance.sequence_major_costs([100, 300], 100, head_groups=1, overhead=1)
        self.assertEqual(costs, [4, 4, 4, None, None, 2])
        costs = attention_balance.sequence_major_costs([100, 300], 100, head_groups=2, overhead=1)
        self.assertEqual(costs, [4, 4, 4, 4, 4, 4, None, None, 2, None, None, 2])
        # Causal: each sequence's query tiles from the last, both head groups of a tile together.
        costs = attention_balance.sequence_major_costs([100, 300], 100, head_groups=2, bidirectional=False,
                                                       overhead=0)
        self.assertEqual(costs, [3, 3, 2, 2, 1, 1, None, None, None, None, 1, 1])


class WalkTest(unittest.TestCase):
    def test_snake_mirrors_odd_rounds(self):
        # Two CTAs, costs 5 4 | 3 1: round 0 gives CTA 0 item 0 and CTA 1 item 1, round 1 CTA 0 item 3.
        self.assertEqual(attention_balance.snake([5, 4, 3, 1], 2), 7)  # CTA 1: 4 + 3

    def test_claims_go_to_the_cta_that_frees_up_first(self):
        # Items 5 and 4 first; the one that ends first (CTA 1 at 4) takes 3, then CTA 0 (at 5) takes 1.
        self.assertEqual(attention_balance.claimed([5, 4, 3, 1], 2, ahead=0), 7)
        # Claiming a whole item ahead: CTA 1 claims at 0 as well, in CTA order after CTA 0's claim.
        self.assertEqual(attention_balance.claimed([5, 4, 3, 1], 2, ahead=100), 8)

    def test_a_cta_whose_own_item_is_empty_claims_at_once(self):
        self.assertEqual(attention_balance.claimed([5, None, 4], 2, ahead=0), 5)


class SplitTailTest(unittest.TestCase):
    def test_splits_as_the_plan_does(self):
        # plan::split_tail_items' cases (tests/plan/attention_spec_test.cpp): 688 equal items of 32 tiles
        # on 132 CTAs leave 28 in the last round, 4 parts each; 176 of 8 tiles leave 44, 3 parts.
        split = attention_balance.split_tail([33.0] * 688, 132, overhead=1.0, merge=0.5)
        self.assertEqual(len(split), 660 + 28 * 4)
        self.assertEqual(split[659:661], [33.0, 8 + 1.5])
        split = attention_balance.split_tail([9.0] * 176, 132, overhead=1.0, merge=0.5)
        self.assertEqual(split[132:135], [2 + 1.5, 3 + 1.5, 3 + 1.5])  # tiles [0, 2), [2, 5), [5, 8)
        self.assertEqual(len(split), 132 + 44 * 3)
        # No split: a last round more than half full, whole rounds, one round, items of different costs,
        # fewer than two tiles a part.
        for costs in ([9.0] * 256, [9.0] * 264, [9.0] * 100, [9.0] * 175 + [5.0], [4.0] * 176):
            self.assertEqual(attention_balance.split_tail(costs, 132, overhead=1.0), costs)

    def test_the_session_44_prediction(self):
        # D 64 bidirectional 4k and 1k, one sequence (48 tokens an item, an item's fixed cost 1.74 tiles:
        # session 43's fit, 3.1 us over 1.78): the last round's idle CTAs are most of the 4k row's gap.
        # Session 44 predicted with a part's extra cost at half a tile (--merge 0.5).
        four = attention_balance.balance([4096], 48, bidirectional=True, overhead=1.74, merge=0.5)
        self.assertAlmostEqual(four["sequences"], 1.151, places=3)
        self.assertAlmostEqual(four["split"], 1.018, places=3)
        one = attention_balance.balance([1024], 48, bidirectional=True, overhead=1.74, merge=0.5)
        self.assertAlmostEqual(one["sequences"], 1.500, places=3)
        self.assertAlmostEqual(one["split"], 1.153, places=3)
        self.assertNotIn("split", attention_balance.balance([4096], 48, overhead=1.74))

    def test_the_session_45_refit(self):
        # Session 45's ncu counts put a part's extra cost near 6 D 64 tiles (the default --merge): the model
        # then says 4k gains (measured -6.8% / -7.3%) and 1k loses a little (measured level).
        four = attention_balance.balance([4096], 48, bidirectional=True, overhead=1.74)
        self.assertAlmostEqual(four["split"], 1.049, places=3)
        one = attention_balance.balance([1024], 48, bidirectional=True, overhead=1.74)
        self.assertAlmostEqual(one["split"], 1.577, places=3)

class NotesFiguresTest(unittest.TestCase):
    def test_the_session_39_model(self):
        varlen = attention_balance.balance([1638, 3277, 4915, 6554], 32)
        self.assertAlmostEqual(varlen["snake"], 1.033, places=3)
        self.assertAlmostEqual(varlen["claimed"], 1.002, places=3)
        bidirectional = attention_balance.balance([410, 819, 1229, 1638], 48, bidirectional=True)
        self.assertAlmostEqual(bidirectional["snake"], 1.317, places=3)
        self.assertAlmostEqual(bidirectional["claimed"], 1.146, places=3)
        self.assertAlmostEqual(bidirectional["longest"], 1.026, places=3)
        self.assertAlmostEqual(bidirectional["sequences"], 1.026, places=3)  # session 41's walk
        ahead = attention_balance.balance([410, 819, 1229, 1638], 48, bidirectional=True, ahead=1e9)
        self.assertAlmostEqual(ahead["claimed"], 1.180, places=3)

    def test_cli_prints_each_walk(self):
        out = io.StringIO()
        with redirect_stdout(out):
            status = attention_balance.main(["--lengths", "4096", "--tokens-per-item", "32"])
        self.assertEqual(status, 0)
        walks = [line.split()[0] for line in out.getvalue().splitlines()]
        self.assertEqual(walks, ["snake", "claimed", "sequences", "longest"])

    def test_the_session_41_causal_walk(self):
        # Causal 4 x 16k at D 128: sequence-major keeps the balance; 4 x 4k loses it (attention-notes.md).
        long_batch = attention_balance.balance([1638, 3277, 4915, 6554], 32)
        self.assertAlmostEqual(long_batch["sequences"], 1.002, places=3)
        short_batch = attention_balance.balance([409, 819, 1229, 1639], 32)
        self.assertAlmostEqual(short_batch["claimed"], 1.014, places=3)
        self.assertAlmostEqual(short_batch["sequences"], 1.034, places=3)


class FitTest(unittest.TestCase):
    def test_recovers_the_costs_that_made_the_times(self):
        # 1.5 us a tile, 6 us an item: 4096 tokens are 1024 items of 32 tiles, 8 rounds on 132 CTAs; 16384
        # are 4096 items of 128 tiles, 32 rounds; a third row (8192: 2048 items, 16 rounds) fits exactly too.
        rows = [(4096, 8 * (32 * 1.5 + 6) / 1000), (16384, 32 * (128 * 1.5 + 6) / 1000),
                (8192, 16 * (64 * 1.5 + 6) / 1000)]
        tile_us, item_us = attention_balance.fit_item_cost(rows, 32)
        self.assertAlmostEqual(tile_us, 1.5, places=9)
        self.assertAlmostEqual(item_us, 6.0, places=9)

    def test_one_length_cannot_part_the_two_costs(self):
        with self.assertRaises(ValueError):
            attention_balance.fit_item_cost([(4096, 0.5)], 32)
        with self.assertRaises(ValueError):
            attention_balance.fit_item_cost([(4096, 0.5), (4096, 0.51)], 32)

    def test_the_session_42_figures(self):
        # Session 41's one-sequence bidirectional rows on an H100 (performance.md): ours and cuDNN's at D 128
        # and D 256, as attention-notes.md "What an item's end costs" quotes them.
        cases = [((0.489, 7.084), 128, 1.669, 7.708), ((0.439, 6.908), 128, 1.677, 1.208),
                 ((0.951, 13.842), 64, 1.634, 14.3125), ((0.836, 13.279), 64, 1.617, 1.010)]
        for (short, long), block_n, tile, item in cases:
            tile_us, item_us = attention_balance.fit_item_cost([(4096, short), (16384, long)], 32, block_n=block_n)
            self.assertAlmostEqual(tile_us, tile, places=3)
            self.assertAlmostEqual(item_us, item, places=3)

    def test_cli(self):
        out = io.StringIO()
        with redirect_stdout(out):
            status = attention_balance.main(["--fit", "4096:0.489,16384:7.084", "--tokens-per-item", "32"])
        self.assertEqual(status, 0)
        self.assertEqual([line.split()[0] for line in out.getvalue().splitlines()], ["tile", "item", "overhead"])
        self.assertIn("4.62 tiles", out.getvalue())
        for bad in (["--fit", "4096", "--tokens-per-item", "32"],
                    ["--fit", "4096:0.5,16384:7", "--lengths", "4096", "--tokens-per-item", "32"],
                    ["--tokens-per-item", "32"]):
            with redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                with self.assertRaises(SystemExit) as raised:
                    attention_balance.main(bad)
            self.assertEqual(raised.exception.code, 2)


if __name__ == "__main__":
    unittest.main()
