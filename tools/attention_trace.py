#!/usr/bin/env python3
"""Where a work item's time goes in the sm_90a attention kernel, from `attnplan bench --trace-attention FILE`
(docs/attention-trace.md). The trace holds, for a few launches, every CTA's warpgroups' clocks at fixed
points of each work unit (attention_params.h, AttentionTraceEvent). Prints, per file:

  - the launch: its span by the global timer, the SM clock the warpgroups ran at, units per CTA, and how
    unevenly the CTAs ended (the last CTA's end against the mean: the load balance the claims reached);
  - each consumer phase's median, 10th and 90th percentile over every unit and warpgroup, in microseconds:
    wait (begin to the first K/V tile and Q landed), first softmax, loop (the first softmax's end to the
    last P V's: the key tiles after the first), epilogue (normalization and stores), hand-over (the wait
    for the next unit's slot) and setup (the next unit's begin);
  - the same for the producer: its first tile's and Q's issue after the unit's begin, its tiles, the claim
    and the next unit's Q prefetch;
  - "outside the loop": a unit's time less its loop, what the row-time fits call an item's fixed cost plus
    its first tile.

    tools/attention_trace.py trace.json [more.json ...] [--timeline CTA]

--timeline CTA also prints that CTA's units of the first launch, each event's time from the launch's start.
Exit status: 0, or 1 for a file that is not a trace.
"""
import argparse
import json
import statistics
import sys

CONSUMER_PHASES = [  # (name, from event, to event); "next" is the next unit's begin
    ("wait for tile 0 and Q", "begin", "first_tile_landed"),
    ("first softmax", "first_tile_landed", "first_softmax_done"),
    ("loop (tiles after the first)", "first_softmax_done", "last_product_done"),
    ("epilogue (normalize, store)", "last_product_done", "stored"),
    ("hand-over wait", "stored", "next_handed_over"),
    ("next unit's setup", "next_handed_over", "next"),
]
PRODUCER_PHASES = [
    ("first tile issued", "begin", "first_tile_issued"),
    ("Q issued", "begin", "q_issued"),
    ("tiles after the first", "first_tile_issued", "last_tile_issued"),
    ("claim", "last_tile_issued", "next_claimed"),
    ("next Q prefetch", "next_claimed", "next_q_prefetched"),
    ("to the next unit", "next_q_prefetched", "next"),
]


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def role_rate(role):
    """The warpgroup's SM clock in cycles per nanosecond (its own clock and the global timer)."""
    ns = role["end_ns"] - role["start_ns"]
    return (role["end_clock"] - role["start_clock"]) / ns if ns > 0 else None


def phases_of(role, names, phases, rate):
    """Each phase's duration in us for every unit of `role` that has its end event."""
    found = {name: [] for name, _, _ in phases}
    units = role["units"]
    for n, unit in enumerate(units):
        clocks = dict(zip(names, unit["clocks"]))
        if n + 1 < len(units):
            clocks["next"] = units[n + 1]["clocks"][0]
        for name, start, end in phases:
            if start in clocks and end in clocks:
                found[name].append((clocks[end] - clocks[start]) / rate / 1e3)
    return found


def summarize(trace, timeline):
    lines = []
    spec = trace["attention"]
    lines.append(f"{trace.get('config') or 'config'} on {trace['device']}: {trace['tokens']} tokens in "
                 f"{trace['seqs']} sequence(s), {trace['mask']}, block {trace['block_size']}; kernel "
                 f"{'+'.join(trace['kernels'])}: D {spec['head_dim']}, block_m {spec['block_m']}, block_n "
                 f"{spec['block_n']}, {spec['stages']} stages, {spec['warps'] // 4 - 1} consumer warpgroups")
    producer_names, consumer_names = trace["producer_events"], trace["consumer_events"]
    spans, rates, per_cta, spreads = [], [], [], []
    consumer = {name: [] for name, _, _ in CONSUMER_PHASES}
    producer = {name: [] for name, _, _ in PRODUCER_PHASES}
    outside = []
    for launch in trace["launches"]:
        roles = [role for cta in launch["ctas"] for role in cta["roles"]]
        if not roles:
            continue
        start = min(role["start_ns"] for role in roles)
        ends = [max(role["end_ns"] for role in cta["roles"]) for cta in launch["ctas"]]
        spans.append((max(ends) - start) / 1e3)
        mean_end = statistics.mean(end - start for end in ends)
        spreads.append((max(ends) - start) / mean_end if mean_end > 0 else 1.0)
        for cta in launch["ctas"]:
            for role in cta["roles"]:
                rate = role_rate(role)
                if rate is None:
                    continue
                rates.append(rate)
                if role["role"] == 0:
                    per_cta.append(role["units_walked"])
                    for name, values in phases_of(role, producer_names, PRODUCER_PHASES, rate).items():
                        producer[name] += values
                else:
                    for name, values in phases_of(role, consumer_names, CONSUMER_PHASES, rate).items():
                        consumer[name] += values
                    units = role["units"]
                    for n in range(len(units) - 1):
                        clocks = dict(zip(consumer_names, units[n]["clocks"]))
                        whole = units[n + 1]["clocks"][0] - clocks["begin"]
                        loop = clocks["last_product_done"] - clocks["first_softmax_done"]
                        outside.append((whole - loop) / rate / 1e3)
    if not spans:
        return lines + ["  no CTA walked a unit"]
    lines.append(f"  {len(spans)} launches: span {statistics.median(spans):.1f} us (median), SM clock "
                 f"{statistics.median(rates):.2f} GHz, {statistics.mean(per_cta):.1f} units per CTA "
                 f"({min(per_cta)} to {max(per_cta)}), last CTA's end {statistics.median(spreads):.3f} x the "
                 f"mean CTA's, {sum(launch['dropped_units'] for launch in trace['launches'])} units not "
                 "recorded")

    def table(title, found):
        lines.append(f"  {title:<32} {'median us':>10} {'p10':>8} {'p90':>8} {'units':>6}")
        for name, values in found.items():
            if values:
                lines.append(f"    {name:<30} {statistics.median(values):>10.2f} {percentile(values, 0.1):>8.2f} "
                             f"{percentile(values, 0.9):>8.2f} {len(values):>6}")
    table("consumer warpgroup, per unit", consumer)
    table("producer, per unit", producer)
    if outside:
        lines.append(f"  outside the loop (a unit less its tiles after the first): median "
                     f"{statistics.median(outside):.2f} us, p10 {percentile(outside, 0.1):.2f}, p90 "
                     f"{percentile(outside, 0.9):.2f}")
    if timeline is not None:
        launch = trace["launches"][0]
        ctas = [cta for cta in launch["ctas"] if cta["cta"] == timeline]
        if not ctas:
            lines.append(f"  timeline: CTA {timeline} walked no unit in the first launch")
        else:
            start = min(role["start_ns"] for cta in launch["ctas"] for role in cta["roles"])
            for role in ctas[0]["roles"]:
                rate = role_rate(role)
                names = producer_names if role["role"] == 0 else consumer_names
                origin = role["start_ns"] - start  # the role's first record, by the global timer
                lines.append(f"  timeline CTA {timeline}, {'producer' if role['role'] == 0 else 'consumer warpgroup ' + str(role['role'] - 1)} (us from the launch's start):")
                for unit in role["units"]:
                    moments = ", ".join(
                        f"{name} {origin / 1e3 + (clock - role['start_clock']) / rate / 1e3:.2f}"
                        for name, clock in zip(names, unit["clocks"]))
                    lines.append(f"    unit {unit['unit']}: {moments}")
    return lines


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--timeline", type=int, default=None, metavar="CTA")
    args = parser.parse_args(argv)
    for path in args.files:
        try:
            with open(path) as handle:
                trace = json.load(handle)
            print("\n".join(summarize(trace, args.timeline)))
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"attention_trace: {path}: not a trace ({error})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
