#!/usr/bin/env python3
"""Layer-0 sweeps of the same cases run with different orders (scripts/device-trace's variants): per
case, each run's best fused time (and its n_comm), beside its GEMM alone and comm alone, and each run's
best against the first's. The runs are not timed in rotation: a run's own GEMM-alone time shows how far
the clocks drifted between them.

  python3 bench/sweep_compare.py NAME=SWEEP.json NAME=SWEEP.json ...
"""
import json
import sys


def best_fused(path):
    cases = {}
    for r in json.load(open(path)):
        if r.get("system") != "comet" or r.get("layer") != "l0":
            continue
        key = (r["model"], r["layout"], r["link"], r["routing"], r["tokens_per_rank"])
        c = cases.setdefault(key, {"fused": {}, "comm": {}, "gemm": None})
        if r.get("mode") == "fused" and not r.get("tuned") and r.get("n_comm", 0) > 0:
            c["fused"][r["n_comm"]] = r["median_ms"]
        elif r.get("mode") == "comm_only":
            c["comm"][r["n_comm"]] = r["median_ms"]
        elif r.get("mode") == "gemm_only":
            c["gemm"] = r["median_ms"]
    return cases


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    runs = [(a.split("=", 1)[0], best_fused(a.split("=", 1)[1])) for a in argv]
    names = [n for n, _ in runs]
    print("| case | " + " | ".join("%s best (n) / gemm / comm" % n for n in names) + " | " +
          " | ".join("%s / %s" % (n, names[0]) for n in names[1:]) + " |")
    print("|---" * (1 + 2 * len(names) - 1) + "|")
    for key in sorted(runs[0][1]):
        cells, bests = [], []
        for _, cases in runs:
            c = cases.get(key)
            if not c or not c["fused"]:
                cells.append("-")
                bests.append(None)
                continue
            n = min(c["fused"], key=c["fused"].get)
            bests.append(c["fused"][n])
            cells.append("%.3f (%d) / %.3f / %s" % (c["fused"][n], n, c["gemm"] or 0,
                                                   "%.3f" % c["comm"][n] if n in c["comm"] else "-"))
        ratios = ["%.3f" % (b / bests[0]) if b and bests[0] else "-" for b in bests[1:]]
        print("| %s %s %s %s %d | %s | %s |" % (key + (" | ".join(cells), " | ".join(ratios))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
