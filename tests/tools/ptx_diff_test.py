#!/usr/bin/env python3
"""Host tests of tools/ptx_diff.py (no GPU, no toolkit): in the PTX normalization register numbers,
labels, register-count declarations and debug lines do not count as differences, an instruction, an
operand or their order does; a plan the planner refuses for the arch is set aside, not fatal, and so is a
plan the old templates cannot compile.

  python3 tests/tools/ptx_diff_test.py
"""
import os
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ptx_diff  # noqa: E402

BEFORE = """\
.global .align 1 .u8 _ZN8attnplan7kernels5TraitsE;
\t.reg .b32 \t%r<428>;
\t.loc\t1 203 0
$L__BB0_3:
\tadd.s32 \t%r17, %r12, 196608;
\tmbarrier.arrive.expect_tx.shared::cta.b64 _, [%r17], %r19;
\t@%p4 bra \t$L__BB0_3;
$L__info_string7:
"""


class NormalizedTest(unittest.TestCase):
    def test_renumbered_registers_labels_and_debug_lines_are_the_same(self):
        after = (BEFORE.replace("%r<428>", "%r<430>").replace("%r17", "%r20").replace("%r12", "%r3")
                 .replace("$L__BB0_3", "$L__BB0_9").replace("203 0", "207 0")
                 .replace("_info_string7", "_info_string8"))
        self.assertEqual(ptx_diff.normalized(BEFORE), ptx_diff.normalized(after))

    def test_a_changed_operand_differs(self):
        after = BEFORE.replace("196608", "196616")
        self.assertNotEqual(ptx_diff.normalized(BEFORE), ptx_diff.normalized(after))

    def test_a_changed_instruction_differs(self):
        after = BEFORE.replace("add.s32", "sub.s32")
        self.assertNotEqual(ptx_diff.normalized(BEFORE), ptx_diff.normalized(after))

    def test_reordered_instructions_differ(self):
        lines = BEFORE.splitlines()
        swapped = lines[:4] + [lines[5], lines[4]] + lines[6:]
        self.assertNotEqual(ptx_diff.normalized(BEFORE), ptx_diff.normalized("\n".join(swapped)))

    def test_debug_and_globals_are_dropped(self):
        kept = ptx_diff.normalized(BEFORE)
        self.assertFalse(any(".loc" in line or line.startswith(".global") or "info_string" in line
                             for line in kept))
        self.assertIn("\tadd.s32 \t%r, %r, 196608;", kept)


# A stand-in for `attnplan compile PLAN ... --json`: refuses plans whose name holds "fp8act" as the planner
# does (a config error, exit 1), crashes on "broken", and lists one kernel for any other plan.
FAKE_ATTNPLAN = """#!/bin/sh
case "$2" in
  *fp8act*) echo "attnplan: config error: X cannot be planned yet" >&2
            echo "  /projection/activation: fp8 activations are not supported on sm_80" >&2; exit 1 ;;
  *broken*) echo "attnplan: compile error: nvrtc failed" >&2; exit 1 ;;
esac
echo '{"config": "'"$2"'", "kernels": [{"name": "attention", "key": "k-'"$2"'"}]}'
"""


class CompilePlansTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.TemporaryDirectory()
        self.attnplan = os.path.join(self.work.name, "attnplan")
        with open(self.attnplan, "w") as script:
            script.write(FAKE_ATTNPLAN)
        os.chmod(self.attnplan, os.stat(self.attnplan).st_mode | stat.S_IEXEC)

    def tearDown(self):
        self.work.cleanup()

    def test_a_refused_plan_is_set_aside_and_the_others_compile(self):
        keys, refused = ptx_diff.compile_plans(self.attnplan, "templates", self.work.name, "sm_80",
                                               ["a.json", "q-fp8act.json", "b.json"])
        self.assertEqual(keys, {("a.json", "attention"): "k-a.json", ("b.json", "attention"): "k-b.json"})
        self.assertEqual(list(refused), ["q-fp8act.json"])
        self.assertIn("fp8 activations", refused["q-fp8act.json"])

    def test_a_compile_failure_stops_the_tool(self):
        with self.assertRaises(SystemExit):
            ptx_diff.compile_plans(self.attnplan, "templates", self.work.name, "sm_80", ["broken.json"])

    def test_the_old_side_sets_a_plan_it_cannot_compile_aside(self):
        keys, failed = ptx_diff.compile_plans(self.attnplan, "templates", self.work.name, "sm_80",
                                              ["a.json", "broken.json"], tolerate_failures=True)
        self.assertEqual(keys, {("a.json", "attention"): "k-a.json"})
        self.assertEqual(failed, {"broken.json": "attnplan: compile error: nvrtc failed"})


if __name__ == "__main__":
    unittest.main()
