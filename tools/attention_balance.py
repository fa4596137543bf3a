#!/usr/bin/env python3
"""How evenly the sm_90a attention kernel's persistent grid shares its work items: a load-balance model of
the item walks in templates/attnplan/attention_sm90.cuh, for choosing between them before a GPU is spent.

An item is (query tile, sequence, head group), numbered as the kernel numbers them: heaviest query tile
first (counted down from max_query_len), then sequence, then head group; an item whose query tile lies past
its sequence's chunk has no rows and costs nothing. Its cost is the key tiles it visits (causal: through its
last row; bidirectional, one span over the chunk: every tile of the sequence) plus `overhead` tiles for its
start and end. Prints, per walk, the largest CTA load over the mean load (1.000: perfectly even):

  snake     the static walk (the kernel's before sessions 39-40): CTA b takes item r * G + b in even
            rounds r, its mirror r * G + G - 1 - b in odd ones
  claimed   the dynamic schedule: a CTA's first item is its own index, each next one is claimed from a
            counter when `ahead` tiles of the current one remain (the kernel claims once its producer has
            issued the item's last tile: about the pipeline's depth)
  sequences claimed, numbered sequence-major with the sequences longest first; bidirectional: then
            head group, then query tile (the kernel's walk since session 41 when every chunk is one span:
            plan::longest_first_sequences); causal: then query tile, then head group (measured in
            session 42, not merged)
  longest   claimed, in longest-item-first order (a bound: the kernel cannot sort items by cost on the
            device)
  split     bidirectional only: `sequences` with the split tail (session 44, merged in session 45): when the
            items cost the same and the last round would be at most half full, its items are cut into
            parts over their key tiles as plan::split_tail_items cuts them, each part costing its tiles,
            the item overhead and `--merge` tiles more (its partial's write, the last part's merge;
            session 45's ncu counts put it near 6 tiles of D 64: attention-notes.md "Session 45")

--fit LENGTH:MS,... (one sequence, bidirectional: every item costs the same) goes the other way: from
measured times of rows of different lengths, the cost of a key tile and the fixed cost of an item (its
start and end), by least squares over time = rounds x (tiles x tile_us + item_us), where rounds is the
makespan CTA's item count (ceil(items / CTAs)); prints both and their ratio, the `--overhead` in tiles that
the balance model should use for that kernel (attention-notes.md "What an item's end costs").

    tools/attention_balance.py --lengths 1638,3277,4915,6554 --tokens-per-item 32
    tools/attention_balance.py --lengths 410,819,1229,1638 --tokens-per-item 48 --bidirectional
    tools/attention_balance.py --fit 4096:0.489,16384:7.084 --tokens-per-item 32

Defaults: GQA 32/8 (8 head groups of 4 heads), 128-key tiles, 132 CTAs (an H100 / H200), overhead 1,
ahead 2.5, merge 6.
Standard library only.
"""
import argparse
import heapq
import math
import sys


def item_costs(lengths, tokens_per_item, block_n=128, head_groups=8, bidirectional=False, overhead=1.0):
    """Each item's cost in the kernel's numbering; None for an item without rows."""
    query_tiles = math.ceil(max(lengths) / tokens_per_item)
    costs = []
    for item in range(query_tiles * len(lengths) * head_groups):
        sequence = (item % (len(lengths) * head_groups)) // head_groups
        row_begin = (query_tiles - 1 - item // (len(lengths) * head_groups)) * tokens_per_item
        length = lengths[sequence]
        if row_begin >= length:
            costs.append(None)
            continue
        last_row = min(row_begin + tokens_per_item, length) - 1
        tiles = math.ceil(length / block_n) if bidirectional else last_row // block_n + 1
        costs.append(tiles + overhead)
    return costs


def sequence_major_costs(lengths, tokens_per_item, block_n=128, head_groups=8, bidirectional=True,
                         overhead=1.0):
    """Each item's cost in a sequence-major numbering, the sequences longest first. Bidirectional (one span
    per chunk): then head group, then query tile from the last (the kernel's walk since session 41:
    plan::longest_first_sequences). Causal (measured in session 42, not merged: attention-notes.md): then query
    tile from the last, then head group, so each sequence's heavy tiles come first."""
    query_tiles = math.ceil(max(lengths) / tokens_per_item)
    costs = []
    for sequence in sorted(range(len(lengths)), key=lambda s: -lengths[s]):
        length = lengths[sequence]

        def cost(tile):
            row_begin = (query_tiles - 1 - tile) * tokens_per_item
            if row_begin >= length:
                return None
            last_row = min(row_begin + tokens_per_item, length) - 1
            return (math.ceil(length / block_n) if bidirectional else last_row // block_n + 1) + overhead

        if bidirectional:
            costs.extend(cost(tile) for _ in range(head_groups) for tile in range(query_tiles))
        else:
            costs.extend(cost(tile) for tile in range(query_tiles) for _ in range(head_groups))
    return costs


def split_tail(costs, ctas, overhead=1.0, merge=6.0, max_parts=4, max_units=160):
    """`costs` with the last round's items split as plan::split_tail_items splits them (at most half a round
    of equal-cost items, into min(max_parts, ctas // tail, tiles // 2, max_units // tail) parts, part p of
    k holding tiles [p t / k, (p + 1) t / k)), each part costing its tiles + overhead + merge; unchanged
    where the rule does not split (items of different costs, a last round more than half full)."""
    items = len(costs)
    if items <= ctas or None in costs or len(set(costs)) != 1:
        return list(costs)
    tail = items - (items - 1) // ctas * ctas
    tiles = round(costs[0] - overhead)
    parts = min(max_parts, ctas // tail, tiles // 2, max_units // tail)
    if 2 * tail > ctas or parts < 2:
        return list(costs)
    split = list(costs[:items - tail])
    for _ in range(tail):
        split.extend((p + 1) * tiles // parts - p * tiles // parts + overhead + merge for p in range(parts))
    return split


def snake(costs, ctas):
    """Largest CTA load of the static walk."""
    loads = [0.0] * ctas
    for round_ in range(math.ceil(len(costs) / ctas)):
        for cta in range(ctas):
            item = round_ * ctas + (cta if round_ % 2 == 0 else ctas - 1 - cta)
            if item < len(costs) and costs[item] is not None:
                loads[cta] += costs[item]
    return max(loads)


def claimed(costs, ctas, ahead):
    """Largest CTA load when each CTA claims its next item `ahead` tiles before the current one ends (the
    first item: its own index, passing over items without rows by claiming as the kernel does)."""
    work = [cost for cost in costs[ctas:] if cost is not None]
    firsts = [cost for cost in costs[:ctas] if cost is not None]
    # A CTA whose own item has no rows claims at once; model it as a CTA that starts idle.
    events = []  # (claim time, cta, end time of its current item)
    finish = [0.0] * ctas
    for cta in range(ctas):
        end = firsts[cta] if cta < len(firsts) else 0.0
        events.append((max(0.0, end - ahead), cta, end))
    heapq.heapify(events)
    next_item = 0
    while events:
        _, cta, end = heapq.heappop(events)
        finish[cta] = end
        if next_item < len(work):
            new_end = end + work[next_item]
            next_item += 1
            heapq.heappush(events, (max(end, new_end - ahead), cta, new_end))
    return max(finish)


def balance(lengths, tokens_per_item, ctas=132, bidirectional=False, overhead=1.0, ahead=2.5, merge=6.0,
            **shape):
    """{walk: largest load / mean load} for each walk."""
    costs = item_costs(lengths, tokens_per_item, bidirectional=bidirectional, overhead=overhead, **shape)
    mean = sum(cost for cost in costs if cost is not None) / ctas
    longest = sorted((cost for cost in costs if cost is not None), reverse=True)
    result = {"snake": snake(costs, ctas) / mean, "claimed": claimed(costs, ctas, ahead) / mean}
    by_sequence = sequence_major_costs(lengths, tokens_per_item, bidirectional=bidirectional, overhead=overhead,
                                       **shape)
    result["sequences"] = claimed(by_sequence, ctas, ahead) / mean
    result["longest"] = claimed(longest, ctas, ahead) / mean
    if bidirectional:
        result["split"] = claimed(split_tail(by_sequence, ctas, overhead, merge), ctas, ahead) / mean
    return result


def fit_item_cost(rows, tokens_per_item, ctas=132, block_n=128, head_groups=8):
    """(tile_us, item_us) from [(length, ms)] of one-sequence bidirectional rows, by least squares."""
    equations = []  # time_us = a * tile_us + b * item_us
    for length, ms in rows:
        rounds = math.ceil(math.ceil(length / tokens_per_item) * head_groups / ctas)
        equations.append((rounds * math.ceil(length / block_n), rounds, ms * 1000.0))
    saa = sum(a * a for a, _, _ in equations)
    sab = sum(a * b for a, b, _ in equations)
    sbb = sum(b * b for _, b, _ in equations)
    say = sum(a * y for a, _, y in equations)
    sby = sum(b * y for _, b, y in equations)
    determinant = saa * sbb - sab * sab
    if len(equations) < 2 or abs(determinant) <= 1e-9 * saa * sbb:
        raise ValueError("--fit needs rows whose tiles per item differ (two lengths at least)")
    return (say * sbb - sby * sab) / determinant, (saa * sby - sab * say) / determinant


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", help="chunk lengths, comma-separated")
    parser.add_argument("--fit", help="LENGTH:MS,... measured one-sequence bidirectional rows")
    parser.add_argument("--tokens-per-item", type=int, required=True,
                        help="block_m / heads_per_cta (GQA 4: 32 at D 128, 48 at D 64)")
    parser.add_argument("--block-n", type=int, default=128)
    parser.add_argument("--head-groups", type=int, default=8)
    parser.add_argument("--ctas", type=int, default=132)
    parser.add_argument("--bidirectional", action="store_true")
    parser.add_argument("--overhead", type=float, default=1.0)
    parser.add_argument("--ahead", type=float, default=2.5)
    parser.add_argument("--merge", type=float, default=6.0,
                        help="a split part's cost beyond its tiles and the item overhead, in tiles")
    args = parser.parse_args(argv)
    if (args.lengths is None) == (args.fit is None):
        parser.error("give --lengths (the balance of the walks) or --fit (an item's costs), not both")
    if args.fit is not None:
        try:
            rows = [(int(length), float(ms)) for length, ms in (row.split(":") for row in args.fit.split(","))]
        except ValueError:
            parser.error("--fit: LENGTH:MS pairs, comma-separated (e.g. 4096:0.489,16384:7.084)")
        if min(length for length, _ in rows) < 1 or min(ms for _, ms in rows) <= 0 or args.tokens_per_item < 1:
            parser.error("--fit lengths and times and --tokens-per-item must be positive")
        try:
            tile_us, item_us = fit_item_cost(rows, args.tokens_per_item, args.ctas, args.block_n, args.head_groups)
        except ValueError as error:
            parser.error(str(error))
        print(f"tile     {tile_us:.3f} us")
        print(f"item     {item_us:.3f} us")
        print(f"overhead {item_us / tile_us:.2f} tiles")
        return 0
    lengths = [int(length) for length in args.lengths.split(",")]
    if not lengths or min(lengths) < 1 or args.tokens_per_item < 1 or args.ctas < 1:
        parser.error("lengths, --tokens-per-item and --ctas must be positive")
    result = balance(lengths, args.tokens_per_item, args.ctas, args.bidirectional, args.overhead, args.ahead,
                     args.merge, block_n=args.block_n, head_groups=args.head_groups)
    for walk, ratio in result.items():
        print(f"{walk:9s} {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
