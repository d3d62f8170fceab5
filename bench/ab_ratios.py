"""Two comet-bench runs of the same cases (e.g. the shipped table in A, a new one in B), each paired with
the sequential baseline: per case and layer, the ratio sequential / comet in each run and B's over A's.
Comparing the two ratios, not the two comet times, cancels what drifted between the runs (clocks,
temperature), since each run timed its own baseline in rotation with comet.

    python3 bench/ab_ratios.py A.json B.json [--layers l1,fwd] [--moved 0.015]

Prints, per layer, the median and range of B / A and the cases whose ratio moved by more than --moved.
"""
import statistics
import sys

from summarize_backward import load  # records of every file, list or {"records": [...]} form


def ratios(path):
    times = {}
    for r in load([path]):
        if r.get("paired") and (r["system"] == "sequential" or (r["system"] == "comet" and r.get("mode") == "fused")):
            key = (r["model"], r["layout"], r["link"], r["routing"], r["tokens_per_rank"], r["layer"])
            times.setdefault(key, {})[r["system"]] = r["median_ms"]
    return {k: v["sequential"] / v["comet"] for k, v in times.items() if len(v) == 2}


def main(argv):
    args = list(argv)
    layers, moved = None, 0.015
    if "--layers" in args:
        i = args.index("--layers")
        layers = args[i + 1].split(",")
        del args[i:i + 2]
    if "--moved" in args:
        i = args.index("--moved")
        moved = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__)
        return 2
    a, b = ratios(args[0]), ratios(args[1])
    common = sorted(set(a) & set(b))
    for layer in layers or sorted({k[5] for k in common}):
        keys = [k for k in common if k[5] == layer]
        if not keys:
            continue
        q = [b[k] / a[k] for k in keys]
        print(f"{layer}: {len(keys)} cases, B / A median {statistics.median(q):.3f}, range {min(q):.3f}-{max(q):.3f}; "
              f"below 1.00 A {sum(a[k] < 1 for k in keys)}, B {sum(b[k] < 1 for k in keys)}")
        for k in keys:
            if abs(b[k] / a[k] - 1) > moved:
                print(f"    {k[0]} {k[1]} {k[2]} {k[4]}: {a[k]:.3f} -> {b[k]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
