#!/usr/bin/env python3
"""The sm_90a attention kernel's barrier protocol with Q in bands, as a model explored over random interleavings.

What it models (templates/attnplan/attention_sm90.cuh, two consumer warpgroups on the overlapped schedule:
D 128; attention-notes.md "Session 46" and "Session 47"): three actors, the producer (per item, on the TMA
path tile 0, then Q band 0 and band 1, each after its warpgroup released the previous item's band, then
the other tiles; on the gathering paths the two bands first; at the end one end marker per warpgroup) and
the two consumer warpgroups (per unit: the item hand-over, their Q band, tile 0, the stagger's named
barriers 6 and 7, then the tiles, releasing each stage as the kernel does, and their Q band after the
last S). Items of 1 to 8 tiles, 2 or 3 stages. It reports a deadlock (no actor can move and not all are
done) or a named barrier given a second arrival of one side before the other side's bar.sync took the
first (which the hardware would count into the wrong generation). Not modelled: the split tail's merge
barrier (named barrier 5, which both warpgroups reach after their stagger points of the unit), the
ping-pong turns of D 256 (bands without the stagger) and D 64's one band (the protocol before the bands).

Exit 0 when the protocol passes and each of two broken variants fails (so the model can fail): warpgroup
0 without barrier 7 (neither warpgroup 1's arrivals nor warpgroup 0's waits), and a producer that waits
on a stage one release too late. ctest runs it (tools_attention_q_bands_model).

    tools/attention_q_bands_model.py [RUNS]   # RUNS seeds (default 5000), each over 2 x 2 configurations
"""
import random
import sys


def run(tiles, stages, seed, broken=None, gather=False):
    rnd = random.Random(seed)
    n = len(tiles)
    base = [sum(tiles[:k]) for k in range(n)]
    total = sum(tiles)
    landed = set()  # global tile indices whose data landed
    released = [[False] * total for _ in range(2)]  # per warpgroup: its release of global tile g's stage
    q_full = [set(), set()]  # items whose band w landed
    q_released = [set(), set()]  # items whose band w its warpgroup released
    handed = [0, 0]  # producer arrivals on warpgroup w's item barrier
    barrier = {6: [0, 0], 7: [1, 0]}  # [arrivals, completed syncs]; warpgroup 1 arrives on 7 once at start

    producer = []
    for k in range(n):
        if gather:  # the gathering paths copy Q's bands before the item's first tile
            producer += [("q", k, 0), ("q", k, 1)]
        for i in range(tiles[k]):
            producer.append(("tile", base[k] + i))
            if i == 0 and not gather:
                producer += [("q", k, 0), ("q", k, 1)]
    producer += [("end", 0), ("end", 1)]

    def consumer(w):
        steps = []
        for k in range(n):
            if k > 0:
                steps.append(("item", k))
            steps += [("qfull", k), ("full", base[k])]
            if w == 1 or broken != "no-barrier-7":
                steps.append(("sync", 7 if w == 0 else 6))
            if w == 0 or broken != "no-barrier-7":
                steps.append(("arrive", 7 if w == 1 else 6))  # after S(0) issue / after the first softmax
            length = tiles[k]
            for i in range(1, length):
                if i > 1:
                    steps.append(("release", base[k] + i - 2))
                steps.append(("full", base[k] + i))
            if length > 1:
                steps.append(("release", base[k] + length - 2))
            steps += [("qrelease", k), ("release", base[k] + length - 1)]
        steps.append(("item", n))  # the end marker
        if w == 0 and broken != "no-barrier-7":
            steps.append(("sync", 7))  # end_stagger
        return steps

    programs = [producer, consumer(0), consumer(1)]
    pc = [0, 0, 0]

    def can_move(actor):
        op = programs[actor][pc[actor]]
        if actor == 0:
            if op[0] == "tile":
                g = op[1] - stages
                free = g < 0 or (released[0][g] and released[1][g])
                if broken == "late-stage" and g >= 0 and g + 1 < total:
                    free = free and released[1][g + 1]
                return free
            if op[0] == "q":
                return op[1] == 0 or op[1] - 1 in q_released[op[2]]
            return n - 1 in q_released[op[1]]  # end
        w = actor - 1
        if op[0] == "item":
            return handed[w] >= op[1]
        if op[0] == "qfull":
            return op[1] in q_full[w]
        if op[0] == "full":
            return op[1] in landed
        if op[0] == "sync":
            return barrier[op[1]][0] > barrier[op[1]][1]
        return True

    while True:
        ready = [a for a in range(3) if pc[a] < len(programs[a]) and can_move(a)]
        if not ready:
            if all(pc[a] == len(programs[a]) for a in range(3)):
                return None
            return "deadlock at " + str([programs[a][pc[a]] if pc[a] < len(programs[a]) else "done" for a in range(3)])
        actor = rnd.choice(ready)
        op = programs[actor][pc[actor]]
        pc[actor] += 1
        if actor == 0:
            if op[0] == "tile":
                landed.add(op[1])
            elif op[0] == "q":
                if op[1] > 0:
                    handed[op[2]] += 1
                q_full[op[2]].add(op[1])
            else:
                handed[op[1]] += 1
        else:
            w = actor - 1
            if op[0] == "release":
                released[w][op[1]] = True
            elif op[0] == "qrelease":
                q_released[w].add(op[1])
            elif op[0] == "sync":
                barrier[op[1]][1] += 1
            elif op[0] == "arrive":
                barrier[op[1]][0] += 1
                if barrier[op[1]][0] - barrier[op[1]][1] > 1:
                    return f"a second arrival on named barrier {op[1]} from warpgroup {w}"


def failures(broken, runs):
    found = []
    for seed in range(runs):
        rnd = random.Random(seed)
        tiles = [rnd.choice([1, 1, 2, 3, 4, 8]) for _ in range(rnd.randint(1, 6))]
        for stages in (2, 3):
            for gather in (False, True):
                result = run(tiles, stages, seed, broken, gather)
                if result:
                    found.append((tiles, stages, "gather" if gather else "tma", result))
    return found


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    ok = True
    protocol = failures(None, runs)
    print(f"the protocol: {len(protocol)} failures in {4 * runs} runs")
    ok = ok and not protocol
    for broken in ("no-barrier-7", "late-stage"):
        found = failures(broken, runs)
        print(f"broken variant {broken}: {len(found)} failures" + (f", e.g. {found[0]}" if found else ""))
        ok = ok and bool(found)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
