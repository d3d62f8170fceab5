"""Summary tables of comet-bench results (markdown), for the README and issue notes.

    python3 bench/summarize.py RESULTS.json [...] > bench/results/SUMMARY.md
"""
import json
import sys
from collections import defaultdict


def load(paths):
    recs = []
    for p in paths:
        recs += json.load(open(p))
    return recs


def index(recs):
    by = defaultdict(list)
    for r in recs:
        by[(r["model"], r["layout"], r["link"], r["routing"], r["tokens_per_rank"], r["layer"])].append(r)
    return by


def pick(rs, system, mode=None, best=False, tuned=False):
    out = [r for r in rs if r["system"] == system and (mode is None or r.get("mode") == mode)
           and bool(r.get("tuned")) == tuned]
    if best:
        out = [r for r in out if r.get("best")] or out
    return min(out, key=lambda r: r["median_ms"]) if out else None


def layer_table(by, layer, models, routing="uniform", link="host"):
    print(f"\n### Layer {layer[-1]} ({routing} routing, {link} link, rank 0 of 8)\n")
    print("| model | layout | tokens | cuBLAS ms (TFLOP/s) | T_gemm ms (TFLOP/s, % of cuBLAS) | T_comm ms (n) | T_seq ms | "
          "T_fused ms (n) | efficiency | sequential ms | chunked ms (C) | vs sequential | vs chunked |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(by):
        model, layout, lnk, rout, tokens, lay = key
        if lay != layer or rout != routing or lnk != link or model not in models:
            continue
        rs = by[key]
        cub, gemm = pick(rs, "cublas"), pick(rs, "comet", "gemm_only")
        fused = pick(rs, "comet", "fused", best=True)
        comm = [r for r in rs if r["system"] == "comet" and r.get("mode") == "comm_only" and fused
                and r.get("n_comm") == fused.get("n_comm")]
        comm = comm[0] if comm else None
        seq, ch = pick(rs, "sequential"), pick(rs, "chunked")
        if not (cub and gemm and fused and comm):
            continue
        eff = fused["median_ms"] / max(gemm["median_ms"], comm["median_ms"])
        print(f"| {model} | {layout} | {tokens} | {cub['median_ms']:.3f} ({cub['tflops']:.0f}) | "
              f"{gemm['median_ms']:.3f} ({gemm['tflops']:.0f}, {100 * cub['median_ms'] / gemm['median_ms']:.0f} %) | "
              f"{comm['median_ms']:.3f} ({comm['n_comm']}) | {gemm['median_ms'] + comm['median_ms']:.3f} | "
              f"{fused['median_ms']:.3f} ({fused['n_comm']}) | {eff:.2f} | "
              f"{seq['median_ms']:.3f} | {ch['median_ms']:.3f} ({ch.get('chunks')}) | "
              f"{seq['median_ms'] / fused['median_ms']:.2f}x | {ch['median_ms'] / fused['median_ms']:.2f}x |")


def forward_table(by, routing="uniform", link="host"):
    print(f"\n### Whole layer, rank 0's forward ({routing} routing, {link} link)\n")
    print("comet: both layers at the sweep's best n_comm; tuned: what a user gets by default (the tuner's picks, "
          "picked_by table/cost_model per layer).\n")
    print("| model | layout | tokens | comet ms | tuned ms (picked by) | sequential ms | chunked ms (C) | "
          "comet vs sequential | comet vs chunked | tuned vs sequential |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(by):
        model, layout, lnk, rout, tokens, lay = key
        if lay != "fwd" or rout != routing or lnk != link:
            continue
        rs = by[key]
        c, s, ch = pick(rs, "comet"), pick(rs, "sequential"), pick(rs, "chunked")
        t = pick(rs, "comet", tuned=True)
        if not (c and s and ch):
            continue
        tuned = f"{t['median_ms']:.3f} ({t.get('picked_by')})" if t else "-"
        tuned_vs = f"{s['median_ms'] / t['median_ms']:.2f}x" if t else "-"
        print(f"| {model} | {layout} | {tokens} | {c['median_ms']:.3f} | {tuned} | {s['median_ms']:.3f} | "
              f"{ch['median_ms']:.3f} ({ch.get('chunks')}) | {s['median_ms'] / c['median_ms']:.2f}x | "
              f"{ch['median_ms'] / c['median_ms']:.2f}x | {tuned_vs} |")


def tuner_table(by):
    """The tuner's pick, timed in the same run, against the best n_comm of the sweep, per layer."""
    print("\n### Tuner picks against the sweep's best (per layer, same run)\n")
    rows, within = [], {"table": [0, 0], "cost_model": [0, 0]}
    for key in sorted(by):
        model, layout, lnk, rout, tokens, lay = key
        if lay not in ("l0", "l1"):
            continue
        rs = by[key]
        best, t = pick(rs, "comet", "fused"), pick(rs, "comet", "fused", tuned=True)
        if not (best and t):
            continue
        ratio = t["median_ms"] / best["median_ms"]
        limit = 1.03 if t.get("picked_by") == "table" else 1.10
        w = within.setdefault(t.get("picked_by"), [0, 0])
        w[0] += ratio <= limit
        w[1] += 1
        rows.append(f"| {model} | {layout} | {lnk} | {rout} | {tokens} | {lay} | {t.get('picked_by')} | "
                    f"{t['median_ms']:.3f} ({t['n_comm']}) | {best['median_ms']:.3f} ({best['n_comm']}) | {ratio:.3f} |")
    for name, (ok, n) in within.items():
        if n:
            print(f"- picked by {name}: {ok} of {n} within {'3' if name == 'table' else '10'} % of the best")
    print("\n| model | layout | link | routing | tokens | layer | picked by | pick ms (n_comm) | best ms (n_comm) | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)


def schedule_table(by, before, layer="l0"):
    """The fused layer at its best n_comm, in these results against earlier ones (another schedule)."""
    print(f"\n### Fused layer {layer[-1]}: these results against {', '.join(before['files'])} (host link)\n")
    print("| model | layout | routing | tokens | T_fused ms (n) here | T_fused ms (n) there | here / there |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(by):
        model, layout, lnk, rout, tokens, lay = key
        if lay != layer or lnk != "host" or key not in before["by"]:
            continue
        a, b = pick(by[key], "comet", "fused"), pick(before["by"][key], "comet", "fused")
        if a and b:
            print(f"| {model} | {layout} | {rout} | {tokens} | {a['median_ms']:.3f} ({a['n_comm']}) | "
                  f"{b['median_ms']:.3f} ({b['n_comm']}) | {a['median_ms'] / b['median_ms']:.3f} |")


if __name__ == "__main__":
    args = sys.argv[1:]
    before = None
    if "--before" in args:  # --before FILE[,FILE...]: compare the fused layer 0 with earlier results
        i = args.index("--before")
        files = args[i + 1].split(",")
        before = {"files": files, "by": index(load(files))}
        del args[i:i + 2]
    sys.argv[1:] = args
    by = index(load(sys.argv[1:]))
    gpu = next(iter(by.values()))[0].get("gpu", "?")
    print(f"# comet-bench summary ({gpu}; files: {', '.join(sys.argv[1:])})")
    print("\nMedians of >= 10 CUDA-event-timed repeats. T_fused at the best n_comm of the sweep; T_comm at that n_comm; "
          "efficiency = T_fused / max(T_gemm, T_comm). link=host: every remote access crosses PCIe, ~50 GB/s; "
          "link=device: peers' buffers in the same GPU's HBM (no interconnect at all: an upper bound for NVLink).")
    all_models = {"mixtral", "qwen2", "phi35", "qwen57", "deepseek"}
    links = sorted({k[2] for k in by}, key=lambda l: l != "host")
    for link in links:
        layer_table(by, "l0", all_models, link=link)
        layer_table(by, "l1", all_models, link=link)
        forward_table(by, link=link)
        forward_table(by, "zipf1.2", link=link)
    tuner_table(by)
    if before:
        schedule_table(by, before)
