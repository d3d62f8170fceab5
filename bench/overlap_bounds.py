"""What overlap can give, case by case, from comet-bench records of one run: for each layer (l0, l1)
T_gemm (comet's GEMM alone), T_comm (the sequential baseline's time less its GEMM: cuBLAS's record when
the run has one, else comet's GEMM alone), and

    bound       = T_seq / max(T_gemm, T_comm)    the speed-up a perfect overlap would give
    achieved    = T_seq / T_fused                 comet with the tuner's picks
    efficiency  = T_fused / max(T_gemm, T_comm)   issue 16's overlap efficiency (goal <= 1.10)

and for the whole forward the steps outside the two layers (plan build, final reduce), which both
systems run alike: extra = T_seq(fwd) - T_seq(l0) - T_seq(l1), and the forward's bound
T_seq(fwd) / (max(l0) + max(l1) + extra).

    python3 bench/overlap_bounds.py RESULTS.json [...] [--list]
"""
import statistics
import sys
from collections import defaultdict

from summarize_backward import load  # records of every file, list or {"records": [...]} form


def pick(records, want):
    """The record that best matches: paired before unpaired."""
    found = [r for r in records if want(r)]
    found.sort(key=lambda r: not r.get("paired"))
    return found[0]["median_ms"] if found else None


def main(argv):
    show = "--list" in argv
    paths = [a for a in argv if a != "--list"]
    cases = defaultdict(list)
    for r in load(paths):
        cases[(r["link"], r["model"], r["layout"], r["routing"], r["tokens_per_rank"])].append(r)

    per_link = defaultdict(lambda: defaultdict(list))
    for key, recs in sorted(cases.items()):
        link = key[0]
        layer_t = {}
        for layer in ("l0", "l1"):
            of = [r for r in recs if r["layer"] == layer]
            seq = pick(of, lambda r: r["system"] == "sequential")
            fused = pick(of, lambda r: r["system"] == "comet" and r.get("mode") == "fused" and r.get("tuned"))
            gemm = pick(of, lambda r: r["system"] == "comet" and r.get("mode") == "gemm_only")
            gemm_seq = pick(of, lambda r: r["system"] == "cublas") or gemm
            if None in (seq, fused, gemm):
                continue
            comm = max(seq - gemm_seq, 0.0)
            ideal = max(gemm, comm)
            layer_t[layer] = (seq, ideal)
            row = (seq / ideal, seq / fused, fused / ideal)
            per_link[link][layer].append(row)
            if show:
                print(f"  {link:6} {layer:3} {' '.join(map(str, key[1:])):32} T_gemm {gemm:8.3f} T_comm {comm:8.3f} "
                      f"bound {row[0]:.2f} achieved {row[1]:.2f} efficiency {row[2]:.2f}")
        fwd = [r for r in recs if r["layer"] == "fwd"]
        seq = pick(fwd, lambda r: r["system"] == "sequential")
        fused = pick(fwd, lambda r: r["system"] == "comet" and r.get("mode") == "fused" and r.get("tuned"))
        if seq and fused and len(layer_t) == 2:
            extra = max(seq - layer_t["l0"][0] - layer_t["l1"][0], 0.0)
            ideal = layer_t["l0"][1] + layer_t["l1"][1] + extra
            per_link[link]["fwd"].append((seq / ideal, seq / fused, fused / ideal, extra / seq))
            if show:
                print(f"  {link:6} fwd {' '.join(map(str, key[1:])):32} outside the layers {extra:8.3f} ms "
                      f"({100 * extra / seq:.0f} % of sequential) bound {seq / ideal:.2f} achieved {seq / fused:.2f}")

    for link, layers in sorted(per_link.items()):
        for layer in ("l0", "l1", "fwd"):
            rows = layers.get(layer)
            if not rows:
                continue
            bound, achieved, eff = (statistics.median(x[i] for x in rows) for i in range(3))
            good = sum(x[2] <= 1.10 for x in rows)
            line = (f"{link} {layer}: {len(rows)} cases, median bound {bound:.3f}, achieved {achieved:.3f}, "
                    f"efficiency {eff:.3f} (<= 1.10 in {good})")
            if layer == "fwd":
                line += f", outside the layers median {100 * statistics.median(x[3] for x in rows):.0f} % of sequential"
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
