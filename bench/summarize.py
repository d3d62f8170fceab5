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


def layer_table(by, layer, models, routing="uniform"):
    print(f"\n### Layer {layer[-1]} ({routing} routing, host link, rank 0 of 8)\n")
    print("| model | layout | tokens | cuBLAS ms (TFLOP/s) | T_gemm ms (TFLOP/s, % of cuBLAS) | T_comm ms (n) | T_seq ms | "
          "T_fused ms (n) | efficiency | sequential ms | chunked ms (C) | vs sequential | vs chunked |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(by):
        model, layout, link, rout, tokens, lay = key
        if lay != layer or rout != routing or model not in models:
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


def forward_table(by, routing="uniform"):
    print(f"\n### Whole layer, rank 0's forward ({routing} routing, host link)\n")
    print("| model | layout | tokens | comet ms | sequential ms | chunked ms (C) | comet vs sequential | comet vs chunked |")
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(by):
        model, layout, link, rout, tokens, lay = key
        if lay != "fwd" or rout != routing:
            continue
        rs = by[key]
        c, s, ch = pick(rs, "comet"), pick(rs, "sequential"), pick(rs, "chunked")
        if not (c and s and ch):
            continue
        print(f"| {model} | {layout} | {tokens} | {c['median_ms']:.3f} | {s['median_ms']:.3f} | "
              f"{ch['median_ms']:.3f} ({ch.get('chunks')}) | {s['median_ms'] / c['median_ms']:.2f}x | "
              f"{ch['median_ms'] / c['median_ms']:.2f}x |")


if __name__ == "__main__":
    by = index(load(sys.argv[1:]))
    gpu = next(iter(by.values()))[0].get("gpu", "?")
    print(f"# comet-bench summary ({gpu}; files: {', '.join(sys.argv[1:])})")
    print("\nMedians of >= 10 CUDA-event-timed repeats. T_fused at the best n_comm of the sweep; T_comm at that n_comm; "
          "efficiency = T_fused / max(T_gemm, T_comm). Every remote access crosses PCIe (link=host), ~50 GB/s.")
    all_models = {"mixtral", "qwen2", "phi35", "qwen57", "deepseek"}
    layer_table(by, "l0", all_models)
    layer_table(by, "l1", all_models)
    forward_table(by)
    forward_table(by, "zipf1.2")
