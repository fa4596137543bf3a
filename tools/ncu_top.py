#!/usr/bin/env python3
"""Where a kernel's warps wait: the SASS instructions with the most stall samples in an Nsight Compute
source export (`ncu --import R.ncu-rep --page source --csv --print-source sass > R-sass.csv`, from a
profile with the SourceCounters section, as tools/profile.sh takes), each with its share of all samples,
its execution count and, with --context, the instructions just before it (a wait's branch is stalled on
the barrier test above it).

    tools/ncu_top.py gpu-logs/profile/attention-d128-4k-p16-sass.csv [--top 20] [--context 3]
    tools/ncu_top.py A-sass.csv B-sass.csv         # two profiles side by side
    tools/ncu_top.py fp8-llama-8k-sass.csv --kernel 1   # the second profiled launch of an export
    tools/ncu_top.py A-sass.csv [B-sass.csv] --reasons  # also the stall reasons, overall and per line
    tools/ncu_top.py A-sass.csv B-sass.csv --regions --opcodes [--reasons]   # where each runs, by what

An export of several launches (profile.sh's gemm and fp8 parts take two: q|k|v, then o) holds one section
per launch, each opened by its kernel name row; --kernel picks one (default the first).

--reasons adds what the warps were stalled on, from the export's per-reason sample columns (`stall_wait`,
`stall_dispatch`, ...; the "(Not Issued)" ones left out): first each file's reasons as shares of all its
samples ("unnamed": samples no column holds, as on some wgmma issues), then, with one file, each listed
instruction's three largest. Session 33 found the fp8 GEMM's top reason, "dispatch", this way.

--regions groups the instructions by how often they ran: code that runs equally often is one region (a
loop body, a unit's prologue, a retry loop), so each execution count is listed with its static lines, the
warp instructions they executed, their samples and (with --reasons) their three largest reasons, largest
first; above them the static and the never-executed lines. --opcodes sums executed instructions and samples
per opcode (its first dotted part, predicates dropped). Session 58 compared D 64's short kernel with
cuDNN's this way (docs/attention-notes.md "The short kernel beside cuDNN's"). With two files each is listed
in turn. --reason NAME (e.g. no_inst) adds one reason's samples to every region, whether or not it is among
the three largest: session 60 found the short kernel's instruction-fetch stalls in its per-unit code so
(docs/attention-notes.md "Session 60").

With two files the listings are aligned as a diff aligns lines (SASS text, branch targets blanked) and each
pair shows both sample counts: how pages of 16 and of 64 differed in session 7 (docs/attention-notes.md).
"""
import argparse
import csv
import difflib
import functools
import os
import re
import sys

import sass as sass_listing  # tools/sass.py: one reading of a SASS line's opcode

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
ADDRESS = re.compile(r"0x[0-9a-f]{9,}")  # absolute code addresses: branch targets


@functools.lru_cache(maxsize=None)
def read_rows(path):
    """The CSV rows of `path`, read once: the listing and the reasons both come from them, and a path that
    can be read only once (`<(zcat A-sass.csv.gz)`) still serves both."""
    with open(path, newline="") as handle:
        return tuple(tuple(row) for row in csv.reader(handle))


def section(path, kernel=0):
    """(header, rows) of launch `kernel` of an ncu source-page CSV export (its sections each open with a
    kernel name row, then the header)."""
    rows = read_rows(path)
    headers = [i for i, row in enumerate(rows) if SAMPLES in row]
    if not headers:
        sys.exit(f"ncu_top: {path} has no '{SAMPLES}' column (profile with --section SourceCounters and "
                 "export with --page source --csv --print-source sass)")
    if not 0 <= kernel < len(headers):
        sys.exit(f"ncu_top: {path} holds {len(headers)} launch(es); --kernel {kernel} is not one of them")
    header_at = headers[kernel]
    # The section ends at the next launch's kernel name row (the row before its header).
    end = headers[kernel + 1] - 1 if kernel + 1 < len(headers) else len(rows)
    return rows[header_at], rows[header_at + 1:end]


def number(text):
    return int(text.replace(",", "")) if text.strip() else 0


def largest(counts, top):
    """[(count, name)] of the `top` largest nonzero counts of {name: count}, largest first."""
    return sorted(((count, name) for name, count in counts.items() if count > 0), reverse=True)[:top]


def load(path, kernel=0):
    """[(address, sass, samples, executed)] in program order, from launch `kernel` of an ncu source-page
    CSV export."""
    header, rows = section(path, kernel)
    address, source = header.index("Address"), header.index("Source")
    samples, executed = header.index(SAMPLES), header.index(EXECUTED)
    return [(row[address], row[source].strip(), number(row[samples]), number(row[executed]))
            for row in rows if len(row) > max(samples, executed)]


def reasons(path, kernel=0):
    """({reason: samples}, {address: {reason: samples}}) of launch `kernel` of an export: the per-reason
    stall sample columns (`stall_<reason>`, not the "(Not Issued)" ones), summed and per instruction."""
    header, rows = section(path, kernel)
    columns = {name[len("stall_"):]: i for i, name in enumerate(header)
               if name.startswith("stall_") and "Not Issued" not in name}
    address = header.index("Address")
    totals = {name: 0 for name in columns}
    per_instruction = {}
    for row in rows:
        if len(row) <= max(columns.values(), default=0):
            continue
        counts = {name: number(row[i]) for name, i in columns.items()}
        per_instruction[row[address]] = counts
        for name, count in counts.items():
            totals[name] += count
    return totals, per_instruction


def reason_line(totals, samples, top=8):
    """`name share%` for the largest reasons, shares of all `samples`, then what no column holds."""
    parts = [f"{name} {100 * count / samples:.1f}%" for count, name in largest(totals, top)]
    unnamed = samples - sum(totals.values())
    if unnamed > 0:
        parts.append(f"unnamed {100 * unnamed / samples:.1f}%")
    return ", ".join(parts)


def top_one(instructions, top, context, stalls=None):
    total = sum(each[2] for each in instructions) or 1
    print(f"{'samples':>8} {'share':>6} {'executed':>10}  sass   (of {total} samples)")
    ranked = sorted(range(len(instructions)), key=lambda i: -instructions[i][2])[:top]
    for i in ranked:
        for before in instructions[max(0, i - context):i]:
            print(f"{'':>8} {'':>6} {before[3]:>10}    {before[1][:90]}")
        address, sass, samples, executed = instructions[i]
        line = f"{samples:>8} {100 * samples / total:5.1f}% {executed:>10}  {sass[:92]}"
        if stalls is not None:
            top_reasons = largest(stalls.get(address, {}), 3)
            line += "  [" + ", ".join(f"{name} {count}" for count, name in top_reasons) + "]"
        print(line)


def opcode(sass):
    """The opcode of a SASS line without its predicate and modifiers: `@!P0 BAR.ARV 0x6` -> BAR."""
    return sass_listing.opcode(sass).split(".")[0]


def regions(instructions, stalls=None, top=12, reason=None):
    """Lines: the instructions grouped by execution count, the `top` groups with the most executed
    instructions, each with its static lines, executed instructions, samples and largest reasons (and,
    given `reason`, that reason's samples)."""
    total_executed = sum(each[3] for each in instructions) or 1
    total_samples = sum(each[2] for each in instructions) or 1
    groups = {}
    for address, _, samples, executed in instructions:
        group = groups.setdefault(executed, {"lines": 0, "samples": 0, "reasons": {}})
        group["lines"] += 1
        group["samples"] += samples
        for name, count in (stalls or {}).get(address, {}).items():
            group["reasons"][name] = group["reasons"].get(name, 0) + count
    never = groups.get(0, {"lines": 0})["lines"]
    lines = [f"{len(instructions)} static lines ({never} never executed), {total_executed} warp "
             f"instructions, {total_samples} samples",
             f"{'executed':>10} {'lines':>6} {'instructions':>13} {'share':>6} {'samples':>8} {'share':>6}"
             + (f" {reason:>8}" if reason else "")]
    ranked = sorted((count for count in groups if count > 0),
                    key=lambda count: -count * groups[count]["lines"])
    for count in ranked[:top]:
        group = groups[count]
        instructions_run = count * group["lines"]
        run_share = 100 * instructions_run / total_executed
        sample_share = 100 * group["samples"] / total_samples
        line = (f"{count:>10} {group['lines']:>6} {instructions_run:>13} {run_share:5.1f}% "
                f"{group['samples']:>8} {sample_share:5.1f}%")
        if reason:
            line += f" {group['reasons'].get(reason, 0):>8}"
        if stalls is not None:
            line += "  [" + ", ".join(f"{name} {n}" for n, name in largest(group["reasons"], 3)) + "]"
        lines.append(line)
    return lines


def opcodes(instructions, top=24):
    """Lines: executed instructions and samples per opcode, the `top` most executed."""
    executed, samples = {}, {}
    for _, sass, sampled, count in instructions:
        name = opcode(sass)
        executed[name] = executed.get(name, 0) + count
        samples[name] = samples.get(name, 0) + sampled
    total = sum(executed.values()) or 1
    lines = [f"{'opcode':<12} {'executed':>12} {'share':>6} {'samples':>8}"]
    for count, name in largest(executed, top):
        lines.append(f"{name:<12} {count:>12} {100 * count / total:5.1f}% {samples[name]:>8}")
    return lines


def aligned(first, second):
    """[(instruction of first or None, instruction of second or None)]: the two listings aligned as a diff
    aligns lines, on the SASS text with absolute addresses (branch targets) blanked, so the same code in
    two builds pairs up even where one has a few instructions more."""
    def key(instruction):
        return " ".join(ADDRESS.sub("ADDR", instruction[1]).split())

    matcher = difflib.SequenceMatcher(None, [key(i) for i in first], [key(i) for i in second], autojunk=False)
    pairs = []
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            pairs.extend(zip(first[a0:a1], second[b0:b1]))
        else:
            pairs.extend((each, None) for each in first[a0:a1])
            pairs.extend((None, each) for each in second[b0:b1])
    return pairs


def top_two(first, second, top):
    total_a = sum(each[2] for each in first) or 1
    total_b = sum(each[2] for each in second) or 1
    print(f"{'first':>8} {'share':>6} {'second':>8} {'share':>6}  sass   ({total_a} and {total_b} samples)")
    pairs = aligned(first, second)
    ranked = sorted(pairs, key=lambda pair: -max(pair[0][2] if pair[0] else 0, pair[1][2] if pair[1] else 0))
    for a, b in ranked[:top]:
        samples_a, samples_b = (a[2] if a else 0), (b[2] if b else 0)
        print(f"{samples_a:>8} {100 * samples_a / total_a:5.1f}% {samples_b:>8} {100 * samples_b / total_b:5.1f}%  "
              f"{(a or b)[1][:80]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", help="one or two ncu source-page CSV exports")
    parser.add_argument("--top", type=int, default=20, help="instructions shown (default 20)")
    parser.add_argument("--context", type=int, default=0, help="instructions shown before each (one file)")
    parser.add_argument("--kernel", type=int, default=0,
                        help="which launch of each export (0: the first; exports of several launches)")
    parser.add_argument("--reasons", action="store_true",
                        help="the stall reasons: each file's shares, and (one file) each line's largest")
    parser.add_argument("--regions", action="store_true",
                        help="the instructions grouped by execution count (loop bodies, per-unit code)")
    parser.add_argument("--opcodes", action="store_true", help="executed instructions and samples per opcode")
    parser.add_argument("--reason", metavar="NAME",
                        help="with --regions: this stall reason's samples in each region (implies --reasons)")
    args = parser.parse_args(argv)
    if len(args.csv) > 2:
        parser.error("one or two CSV files")
    if args.reason and not args.regions:
        parser.error("--reason goes with --regions")
    args.reasons = args.reasons or bool(args.reason)
    listings = [load(path, args.kernel) for path in args.csv]
    stalls = [reasons(path, args.kernel) for path in args.csv] if args.reasons else []
    for path, (totals, _) in zip(args.csv, stalls):
        if args.reason and args.reason not in totals:
            parser.error(f"{os.path.basename(path)} has no stall_{args.reason} column (its reasons: "
                         f"{', '.join(sorted(totals)) or 'none'})")
    for path, listing, (totals, _) in zip(args.csv, listings, stalls):
        print(f"{os.path.basename(path)}: {reason_line(totals, sum(each[2] for each in listing) or 1)}")
    if args.regions or args.opcodes:
        for i, (path, listing) in enumerate(zip(args.csv, listings)):
            print(f"== {os.path.basename(path)}")
            if args.regions:
                print("\n".join(regions(listing, stalls[i][1] if stalls else None, args.top, args.reason)))
            if args.opcodes:
                print("\n".join(opcodes(listing, args.top)))
        return 0
    if len(args.csv) == 1:
        top_one(listings[0], args.top, args.context, stalls[0][1] if stalls else None)
    else:
        top_two(listings[0], listings[1], args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
