#!/usr/bin/env python3
"""Does the best n_comm move with the bytes that cross the link per GEMM flop?

    build/tools/comet-tune --evaluate RESULTS.json --measured-work --dump-work | python3 bench/ncomm_physics.py

Reads comet-tune's WORK lines (each case's measured work and n_comm sweep), splits the cases of each
layer into thirds by link bytes per GEMM kFLOP and prints the best n_comm of their sweeps per third.
"""
import json
import statistics
import sys


def main():
    cases = [json.loads(l[5:]) for l in sys.stdin if l.startswith("WORK ")]
    for layer in (0, 1):
        rows = []
        for c in cases:
            if c["layer"] != layer or c["flops"] <= 0:
                continue
            sweep = {int(n): ms for n, ms in c["sweep"].items()}
            rows.append((c["link_bytes"] / c["flops"] * 1e3, min(sweep, key=sweep.get)))
        rows.sort()
        k = len(rows)
        for i, part in enumerate((rows[: k // 3], rows[k // 3: 2 * k // 3], rows[2 * k // 3:])):
            if not part:
                continue
            best = [b for _, b in part]
            print(f"layer {layer} third {i + 1}: {len(part):3d} cases, {part[0][0]:.3f}-{part[-1][0]:.3f} link bytes per "
                  f"kFLOP, best n_comm median {statistics.median(best):g}, mean {statistics.mean(best):.1f}")


if __name__ == "__main__":
    main()
