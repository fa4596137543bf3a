#!/usr/bin/env python3
"""Does a template change alter the kernels the plans run? Compiles every kernel of the given plans twice
with NVRTC (no GPU needed), once with the templates as they are at a git revision and once with the working
tree's, and compares each kernel's PTX instruction by instruction, register numbers, labels, debug lines and
strings normalized away. A kernel that compiles to the same instructions needs no new GPU evidence; one that
differs is listed with a unified diff of its first differences. The specs are the given build's (its host
code picks every kernel's traits): only the templates differ between the two sides. A plan the planner
refuses for the arch (fp8 activations on sm_80, say) is listed as not planned and the others go on; so is a
plan the old templates fail to compile (a specialization they do not have, such as a new tile width): its
kernels are listed as not comparable and count as differing.

    tools/ptx_diff.py BUILD/attnplan [--rev HEAD] [--arch sm_90a] [--context 3] plans/*.json

Exit status: 0 when every kernel's PTX is the same, 1 when some differ, 2 on a usage or compile error.
Uses `attnplan compile --keep-ptx` with ATTNPLAN_TEMPLATE_DIR and `attnplan cache show KEY --ptx`.
"""
import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile

_SKIPPED = re.compile(r"^\s*(\.loc|//|\.file|\.b8|\$L__info_string)|^\.global")
_REGISTER = re.compile(r"%(r|rd|f|fd|p|rs|h|hh)[0-9]+")
_LABEL = re.compile(r"\$L__BB[0-9_]+")
_REGISTER_COUNT = re.compile(r"^(\s*\.reg\s+\.\w+\s+%\w+)<[0-9]+>")


def normalized(ptx):
    """The PTX's instructions with register numbers and block labels replaced, debug info dropped."""
    lines = []
    for line in ptx.splitlines():
        if _SKIPPED.search(line):
            continue
        line = _REGISTER_COUNT.sub(r"\1<n>", line)
        lines.append(_LABEL.sub("$L", _REGISTER.sub(r"%\1", line)).rstrip())
    return lines


def compile_plans(attnplan, template_dir, cache_dir, arch, plans, tolerate_failures=False):
    """({(plan, kernel name): cache key} of every kernel of `plans` compiled with `template_dir`,
    {plan: reason} of the plans the planner refuses for `arch`, e.g. fp8 activations on sm_80, and, with
    `tolerate_failures`, of the plans whose kernels fail to compile; without it such a failure exits)."""
    environment = dict(os.environ, ATTNPLAN_TEMPLATE_DIR=template_dir)
    keys, refused = {}, {}
    for plan in plans:  # one at a time: a plan refused for this arch must not hide the others
        result = subprocess.run([attnplan, "compile", plan, "--arch", arch, "--cache-dir", cache_dir,
                                 "--keep-ptx", "--json"], capture_output=True, text=True, env=environment)
        if result.returncode != 0:
            if "config error" in result.stderr or tolerate_failures:
                # The planner's refusal, or (old templates) a specialization they cannot compile.
                # A refusal's last line names the field; a compile failure's first error line says what
                # failed (progress lines come before it, the log and the spec after).
                lines = result.stderr.strip().splitlines() or ["(no message)"]
                first_error = next((line for line in lines if "error" in line), lines[0])
                refused[plan] = (lines[-1] if "config error" in result.stderr else first_error).strip()
                continue
            sys.exit(f"ptx_diff: attnplan compile {plan} with templates from {template_dir} failed:\n"
                     f"{result.stderr}")
        compiled = json.loads(result.stdout)
        entries = compiled if isinstance(compiled, list) else [dict(compiled, config=plan)]
        keys.update({(entry["config"], kernel["name"]): kernel["key"]
                     for entry in entries for kernel in entry["kernels"]})
    return keys, refused


def ptx_of(attnplan, cache_dir, key):
    result = subprocess.run([attnplan, "cache", "show", key, "--ptx", "--cache-dir", cache_dir],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"ptx_diff: attnplan cache show {key} failed:\n{result.stderr}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("attnplan", help="the attnplan executable (any build: only the templates differ)")
    parser.add_argument("plans", nargs="+", help="plan configs whose kernels to compare")
    parser.add_argument("--rev", default="HEAD", help="git revision of the old templates (default HEAD)")
    parser.add_argument("--arch", default="sm_90a", help="target arch (default sm_90a)")
    parser.add_argument("--context", type=int, default=3, help="lines of context in each diff")
    parser.add_argument("--lines", type=int, default=40, help="diff lines shown per differing kernel")
    args = parser.parse_args()
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="ptx_diff.") as work:
        old_tree = os.path.join(work, "old")
        os.makedirs(old_tree)
        archive = subprocess.run(["git", "-C", root, "archive", args.rev, "templates"], capture_output=True,
                                 check=False)
        if archive.returncode != 0:
            sys.exit(f"ptx_diff: git archive {args.rev} templates failed: {archive.stderr.decode()}")
        subprocess.run(["tar", "-x", "-C", old_tree], input=archive.stdout, check=True)
        sides = {}
        for side, templates in (("old", os.path.join(old_tree, "templates")),
                                ("new", os.path.join(root, "templates"))):
            cache = os.path.join(work, f"cache-{side}")
            sides[side] = (cache, *compile_plans(args.attnplan, templates, cache, args.arch, args.plans,
                                                 tolerate_failures=side == "old"))
        differing = 0
        # The planner is this build's on both sides (only the templates differ), so both refuse alike; a
        # plan refused only on the old side is one its templates cannot compile.
        for plan, reason in sides["new"][2].items():
            print(f"{os.path.basename(plan):60s} not planned for {args.arch}: {reason}")
        uncompiled = {plan: reason for plan, reason in sides["old"][2].items() if plan not in sides["new"][2]}
        for plan, reason in uncompiled.items():
            kernels = sum(1 for key in sides["new"][1] if key[0] == plan)
            print(f"{os.path.basename(plan):60s} {kernels} kernels not comparable: the templates at {args.rev} "
                  f"do not compile this plan ({reason})")
            differing += kernels
        for plan_kernel, new_key in sorted(sides["new"][1].items()):
            if plan_kernel[0] in uncompiled:
                continue
            old_key = sides["old"][1].get(plan_kernel)
            name = f"{os.path.basename(plan_kernel[0])} {plan_kernel[1]}"
            if old_key is None:
                print(f"{name:60s} new kernel (not in {args.rev}'s plan)")
                differing += 1
                continue
            old = normalized(ptx_of(args.attnplan, sides["old"][0], old_key))
            new = normalized(ptx_of(args.attnplan, sides["new"][0], new_key))
            if old == new:
                print(f"{name:60s} same ({len(new)} lines)")
                continue
            differing += 1
            print(f"{name:60s} DIFFERS ({len(old)} -> {len(new)} lines)")
            diff = list(difflib.unified_diff(old, new, f"{args.rev}", "working tree", n=args.context,
                                             lineterm=""))
            for line in diff[:args.lines]:
                print("    " + line)
        return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
