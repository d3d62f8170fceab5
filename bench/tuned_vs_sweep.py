#!/usr/bin/env python3
"""The tuner's picks as measured, against the best of the n_comm sweep measured in the same run.

    python3 bench/tuned_vs_sweep.py RESULTS.json [...]

For every case (model, layout, link, routing, tokens, layer) of comet-bench results that hold both a
fused sweep and a tuned record ("tuned": true; with the adaptive split on, its n_comm is the one the
kernel chose on the device), prints the tuned run's time over the sweep's best and counts the cases
within 3 % and 10 %, by link, routing and layer. Tuned and sweep are separate timed runs, so a ratio
below 1 is run-to-run noise (the tuned run was faster than the sweep's run of the same or a better n).
"""
import collections
import json
import sys


def main(paths):
    sweeps = collections.defaultdict(dict)
    tuned = {}
    for path in paths:
        for r in json.load(open(path)):
            if r.get("system") != "comet" or r.get("layer") not in ("l0", "l1") or r.get("mode") != "fused":
                continue
            case = (r["model"], r.get("layout", ""), r["link"], r["routing"], r["tokens_per_rank"], r["layer"])
            if r.get("tuned"):
                tuned[case] = r
            else:
                sweeps[case][r["n_comm"]] = r["median_ms"]
    groups = collections.defaultdict(lambda: [0, 0, 0])
    print(f"{'case':<44} {'tuned':>16} {'best of sweep':>16}  ratio  picked_by")
    for case in sorted(tuned):
        sweep = sweeps.get(case)
        if not sweep:
            continue
        t = tuned[case]
        best = min(sweep, key=sweep.get)
        ratio = t["median_ms"] / sweep[best]
        name = " ".join(str(x) for x in case)
        print(f"{name:<44} n={t['n_comm']:<3}{t['median_ms']:9.3f} ms n={best:<3}{sweep[best]:9.3f} ms  {ratio:.3f}  "
              f"{t.get('picked_by', '')}")
        for g in ("all", f"{case[2]} {case[3]} {case[5]}"):
            groups[g][0] += 1
            groups[g][1] += ratio <= 1.03
            groups[g][2] += ratio <= 1.10
    for g, (n, w3, w10) in sorted(groups.items()):
        print(f"# {g:<24} {n:4d} cases, {w3:4d} within 3 %, {w10:4d} within 10 %")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
