"""Sequential / comet ratios of the paired records (timed in rotation) of comet-bench results, per layer:
median, lowest, and the cases below 1.00 (ratio > 1: comet faster). Also the paired GEMM-alone records,
cuBLAS time / comet time, for l0 and l1. With records of comet-bench --one-launch-ab (modes
ab_one_launch_on / _off, timed in the same rotation as the tuned run and the baseline): the other
setting's time / the tuned run's, and sequential / the other setting.

    python3 bench/paired_ratios.py RESULTS.json [...] [--layers l0,l1,fwd,bwd,fwd+bwd] [--list]
"""
import statistics
import sys
from collections import defaultdict

from summarize_backward import load  # records of every file, list or {"records": [...]} form


def main(argv):
    layers = ["l0", "l1", "fwd", "bwd", "fwd+bwd"]
    show = "--list" in argv
    paths = []
    it = iter(a for a in argv if a != "--list")
    for a in it:
        if a == "--layers":
            layers = next(it).split(",")
        else:
            paths.append(a)
    runs, gemms, alts = defaultdict(dict), defaultdict(dict), defaultdict(dict)
    for r in load(paths):
        if not r.get("paired"):
            continue
        key = (r["model"], r["layout"], r["link"], r["routing"], r["tokens_per_rank"], r["layer"])
        if r["system"] == "comet" and r.get("mode") == "gemm_only":
            gemms[key]["comet"] = r["median_ms"]
        elif r["system"] == "cublas":
            gemms[key]["cublas"] = r["median_ms"]
        elif r["system"] == "comet" and r.get("mode", "").startswith("ab_"):
            alts[key][r["mode"]] = r["median_ms"]
        elif r["system"] == "sequential" or (r["system"] == "comet" and r.get("mode") == "fused"):
            runs[key][r["system"]] = r["median_ms"]
    tables = [("sequential / comet", runs, "sequential", "comet"),
              ("GEMM alone, cuBLAS / comet", gemms, "cublas", "comet")]
    for mode in sorted({m for v in alts.values() for m in v}):
        other = {k: {"other": v[mode], **runs[k]} for k, v in alts.items() if mode in v}
        tables += [(f"{mode}: other / tuned", other, "other", "comet"),
                   (f"{mode}: sequential / other", other, "sequential", "other")]
    for title, table, num, den in tables:
        for link in sorted({k[2] for k in table}):
            for layer in layers:
                rows = [(k, v[num] / v[den]) for k, v in sorted(table.items())
                        if k[2] == link and k[5] == layer and num in v and den in v]
                if not rows:
                    continue
                x = [r for _, r in rows]
                print(f"{title}, {link} link, {layer}: {len(x)} cases, median {statistics.median(x):.3f}, "
                      f"lowest {min(x):.3f}, below 1.00: {sum(r < 1 for r in x)}, below 0.98: {sum(r < 0.98 for r in x)}")
                if show:
                    for k, r in rows:
                        if r < 1:
                            print(f"    {k[0]} {k[1]} {k[3]} {k[4]}: {r:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
