#!/usr/bin/env python3
"""Host tests of tools/ncu_top.py (no GPU, no Nsight Compute): it reads the source-page CSV export (kernel
name row, header, one row per SASS instruction), ranks instructions by stall samples, aligns two
listings whose branch targets and lengths differ, and groups them by execution count and opcode.

  python3 tests/tools/ncu_top_test.py
"""
import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ncu_top  # noqa: E402

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"# Samples","Instructions Executed"\n')


def export(rows):
    """An ncu --page source --csv export of (address, sass, samples, executed) rows."""
    lines = ['"Kernel Name","void attention_sm90_kernel<Traits>(Params)",\n', HEADER]
    lines += [f'"{a}","      {s}","{n}","{n}","{n}","{e}"\n' for a, s, n, e in rows]
    return "".join(lines)


FIRST = [("0x7fca00000000", "LDC R1, c[0x0][0x28]", 3, 100),
         ("0x7fca00000010", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR10+0x38000], R11", 29, 1000),
         ("0x7fca00000020", "@!P0  BRA 0x7fca00000400", 1674, 1000),
         ("0x7fca00000030", "HGMMA.64x128x16.F32.BF16 R88, gdesc[UR20], RZ, !UPT", 1228, 1000),
         ("0x7fca00000040", "UTMALDG.2D [UR20], [UR26]", 297, 32000)]
# The same code built elsewhere: other addresses and branch targets, one instruction more.
SECOND = [("0x7f5c00000000", "LDC R1, c[0x0][0x28]", 2, 100),
          ("0x7f5c00000010", "NOP", 0, 100),
          ("0x7f5c00000020", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR10+0x38000], R11", 12, 1000),
          ("0x7f5c00000030", "@!P0  BRA 0x7f5c00000480", 153, 1000),
          ("0x7f5c00000040", "HGMMA.64x128x16.F32.BF16 R88, gdesc[UR20], RZ, !UPT", 279, 1000),
          ("0x7f5c00000050", "UTMALDG.2D [UR20], [UR26]", 80, 8000)]


class NcuTopTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.work.cleanup()

    def write(self, name, rows):
        path = os.path.join(self.work.name, name)
        with open(path, "w") as handle:
            handle.write(export(rows))
        return path

    def run_tool(self, *args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(ncu_top.main(list(args)), 0)
        return out.getvalue().splitlines()

    def test_reads_the_export_in_program_order(self):
        instructions = ncu_top.load(self.write("a.csv", FIRST))
        self.assertEqual([i[2] for i in instructions], [3, 29, 1674, 1228, 297])
        self.assertEqual(instructions[4], ("0x7fca00000040", "UTMALDG.2D [UR20], [UR26]", 297, 32000))

    def test_ranks_by_samples_with_context(self):
        lines = self.run_tool(self.write("a.csv", FIRST), "--top", "2", "--context", "1")
        ranked = [line for line in lines[1:] if "%" in line]
        self.assertIn("@!P0  BRA", ranked[0])
        self.assertIn(f"{100 * 1674 / 3231:.1f}%", ranked[0])
        self.assertIn("HGMMA", ranked[1])
        self.assertIn("TRYWAIT", lines[1])  # the barrier test shown above its branch

    def test_two_listings_pair_the_same_instructions(self):
        pairs = ncu_top.aligned(ncu_top.load(self.write("a.csv", FIRST)),
                                ncu_top.load(self.write("b.csv", SECOND)))
        by_first = {a[1]: b for a, b in pairs if a}
        self.assertEqual(by_first["@!P0  BRA 0x7fca00000400"][2], 153)  # branch targets differ, still a pair
        self.assertEqual(by_first["UTMALDG.2D [UR20], [UR26]"][2], 80)
        self.assertIn((None, SECOND[1]), pairs)  # the extra NOP stands alone
        lines = self.run_tool(self.write("a.csv", FIRST), self.write("b.csv", SECOND), "--top", "1")
        self.assertRegex(lines[1], r"^\s+1674\s+51\.8%\s+153\s+29\.1%\s+@!P0\s+BRA")

    def test_an_export_of_two_launches_reads_the_one_asked_for(self):
        path = os.path.join(self.work.name, "two.csv")
        with open(path, "w") as handle:
            handle.write(export(FIRST) + export(SECOND))
        self.assertEqual([i[2] for i in ncu_top.load(path)], [3, 29, 1674, 1228, 297])
        self.assertEqual([i[2] for i in ncu_top.load(path, 1)], [2, 0, 12, 153, 279, 80])
        lines = self.run_tool(path, "--kernel", "1", "--top", "1")
        self.assertIn("(of 526 samples)", lines[0])
        with self.assertRaises(SystemExit):
            ncu_top.load(path, 2)

    def test_reasons_overall_and_per_instruction(self):
        # Two reason columns (and a "(Not Issued)" one, left out); the wgmma's samples are partly in none.
        header = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
                  '"stall_dispatch","stall_wait","stall_wait (Not Issued)"\n')
        rows = [("0x10", "LEA.HI R206, R206, R206, RZ, 0x1", 700, 100, 585, 61, 9),
                ("0x20", "QGMMA.64x128x32.F32.E4M3.E4M3 R88, gdesc[UR24], RZ, !UPT", 300, 100, 20, 80, 9)]
        path = os.path.join(self.work.name, "reasons.csv")
        with open(path, "w") as handle:
            handle.write('"Kernel Name","void gemm_sm90_fp8_kernel<Traits>(Params)",\n' + header)
            handle.writelines(f'"{a}","  {s}","{n}","{e}","{d}","{w}","{x}"\n' for a, s, n, e, d, w, x in rows)
        totals, per_instruction = ncu_top.reasons(path)
        self.assertEqual(totals, {"dispatch": 605, "wait": 141})
        self.assertEqual(per_instruction["0x20"], {"dispatch": 20, "wait": 80})
        lines = self.run_tool(path, "--reasons", "--top", "2")
        self.assertEqual(lines[0], "reasons.csv: dispatch 60.5%, wait 14.1%, unnamed 25.4%")
        self.assertTrue(lines[2].endswith("[dispatch 585, wait 61]"))
        self.assertTrue(lines[3].endswith("[wait 80, dispatch 20]"))

    def test_regions_group_the_lines_run_equally_often(self):
        lines = ncu_top.regions(ncu_top.load(self.write("a.csv", FIRST)))
        self.assertEqual(lines[0], "5 static lines (0 never executed), 35100 warp instructions, 3231 samples")
        rows = [line.split() for line in lines[2:]]
        # By executed instructions: the TMA issue (32000 once), the three lines run 1000 times, the LDC.
        self.assertEqual([row[:3] for row in rows], [["32000", "1", "32000"], ["1000", "3", "3000"],
                                                     ["100", "1", "100"]])
        self.assertEqual(rows[1][4], str(29 + 1674 + 1228))

    def test_one_reason_per_region(self):
        # --reason adds one column: that reason's samples per region, even where it is not among the three
        # largest; a reason the export has no column for is refused, as is --reason without --regions.
        header = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
                  '"stall_wait","stall_no_inst","stall_barrier","stall_math"\n')
        rows = [("0x10", "FFMA R1, R2, R3, R4", 50, 1000, 30, 1, 10, 9),
                ("0x20", "MUFU.EX2 R5, R6", 40, 1000, 20, 2, 10, 8),
                ("0x30", "STG.E.128 desc[UR4][R8.64], R12", 10, 10, 1, 7, 1, 1)]
        path = os.path.join(self.work.name, "reason.csv")
        with open(path, "w") as handle:
            handle.write('"Kernel Name","void attention_sm90_kernel<Traits>(Params)",\n' + header)
            handle.writelines(f'"{a}","  {s}","{n}","{e}","{w}","{i}","{b}","{m}"\n'
                              for a, s, n, e, w, i, b, m in rows)
        lines = self.run_tool(path, "--regions", "--reason", "no_inst")
        self.assertTrue(lines[3].split()[-1] == "no_inst")
        loop = lines[4].split()
        self.assertEqual(loop[:2], ["1000", "2"])
        self.assertEqual(loop[6], "3")  # not among the loop's three largest (wait, barrier, math)
        self.assertNotIn("no_inst", lines[4].split("[")[1])
        self.assertEqual(lines[5].split()[6], "7")
        for args in (["--regions", "--reason", "imc"], ["--reason", "no_inst"]):
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
                ncu_top.main([path] + args)

    def test_opcodes_sum_without_predicates_or_modifiers(self):
        self.assertEqual(ncu_top.opcode("@!P0  BRA 0x7fca00000400"), "BRA")
        self.assertEqual(ncu_top.opcode("HGMMA.64x128x16.F32.BF16 R88, gdesc[UR20], RZ, !UPT"), "HGMMA")
        lines = self.run_tool(self.write("a.csv", FIRST), "--opcodes", "--top", "2")
        self.assertEqual(lines[0], "== a.csv")
        self.assertEqual(lines[2].split(), ["UTMALDG", "32000", "91.2%", "297"])
        # Ties (BRA, HGMMA, SYNCS at 1000 each): the last name first.
        self.assertEqual(lines[3].split()[0:2], ["SYNCS", "1000"])
        self.assertEqual(len(lines), 4)

    def test_an_export_is_read_once(self):
        # A path that can be read only once (a pipe from zcat) serves the listing and the reasons.
        path = self.write("once.csv", FIRST)
        listing = ncu_top.load(path)
        os.remove(path)
        self.assertEqual(ncu_top.reasons(path)[0], {})  # this export has no per-reason columns
        self.assertEqual(ncu_top.load(path), listing)

    def test_an_export_without_stall_samples_is_refused(self):
        path = os.path.join(self.work.name, "plain.csv")
        with open(path, "w") as handle:
            handle.write('"Address","Source"\n"0x1","NOP"\n')
        with self.assertRaises(SystemExit):
            ncu_top.load(path)


if __name__ == "__main__":
    unittest.main()
