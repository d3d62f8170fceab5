"""Summary tables of comet-bench backward results (markdown): the backward of one layer against the
sequential and chunked baselines, the weight- and data-gradient GEMMs against cuBLAS, and, where a file
has them, forward + backward and the activation-backward epilogue's A/B.

    python3 bench/summarize_backward.py RESULTS.json [...] > bench/results/SUMMARY_backward.md

Records used (comet-bench --layers bwd[,fwd+bwd] --systems comet,sequential,chunked,cublas --paired):
  bwd comet (mode fused, paired) and bwd sequential (paired): timed in rotation, so their ratio does not
  depend on the power-capped H200's clock drift; bwd chunked (best C): in the same rotation where the
  record says paired (comet-bench after bec6493), else timed on its own;
  wgrad / dgrad comet (gemm_only) and cublas: the backward's GEMMs alone (wgrad comet of modes grouped /
  grouped_cooperative: CUTLASS's grouped GEMMs; the bwd record's picked_by "+wgrad:<kernel>" names the
  one the backward ran);
  fwd+bwd comet / sequential (paired); bwd comet modes two_pass / fused_act (--fused-activation-grad).
"""
import json
import statistics
import sys
from collections import defaultdict


def load(paths):
    recs = []
    for p in paths:
        data = json.load(open(p))
        recs += data if isinstance(data, list) else data["records"]
    return recs


def by_case(recs):
    cases = defaultdict(list)
    for r in recs:
        cases[(r["link"], r["model"], r["layout"], r["tokens_per_rank"])].append(r)
    return cases


def find(rs, layer, system, mode=None, paired=None):
    out = [r for r in rs if r["layer"] == layer and r["system"] == system
           and (mode is None or r.get("mode") == mode)
           and (paired is None or bool(r.get("paired")) == paired)]
    return min(out, key=lambda r: r["median_ms"]) if out else None


def ratio(num, den):
    return num["median_ms"] / den["median_ms"] if num and den else None


def fmt(x, spec=".3f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def summary_line(name, values):
    v = [x for x in values if x is not None]
    if not v:
        return f"- {name}: no cases"
    below = sum(x < 1.0 for x in v)
    return (f"- {name}: median {statistics.median(v):.3f}, lowest {min(v):.3f}, highest {max(v):.3f}, "
            f"{below} of {len(v)} below 1.00")


def link_table(link, cases):
    print(f"\n### {link} link (rank 0 of 8, uniform routing)\n")
    print("| model | layout | tokens | comet bwd ms | sequential ms | chunked ms (C) | seq / comet | "
          "chunked / comet | wgrad TFLOP/s comet (/ grouped ping-pong / grouped cooperative) / cuBLAS | dgrad TFLOP/s comet / cuBLAS | fwd+bwd seq / comet |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    vs_seq, vs_chunked, wgrad, dgrad, fwd_bwd, grouped, chunked_paired = [], [], [], [], [], [], []
    wgrad_ran = []
    for key in sorted(k for k in cases if k[0] == link):
        rs = cases[key]
        comet = find(rs, "bwd", "comet", "fused", paired=True)
        seq = find(rs, "bwd", "sequential", paired=True)
        if not comet or not seq:
            continue
        chunked = find(rs, "bwd", "chunked")
        if chunked:
            chunked_paired.append(bool(chunked.get("paired")))
        wc, wb = find(rs, "wgrad", "comet", "gemm_only"), find(rs, "wgrad", "cublas")
        wg = [find(rs, "wgrad", "comet", m) for m in ("grouped", "grouped_cooperative", "grouped_320")]
        # The kernel the backward ran (picked_by "...+wgrad:<kernel>", comet-bench after 0bf5199; since the
        # fifteenth session "+wgrad:<dW1's>/<dW0's>": a pair of two kernels has no record of its own).
        ran = set(comet.get("picked_by", "").partition("+wgrad:")[2].split("/"))
        ran = ran.pop() if len(ran) == 1 else ""
        wr = {"persistent": wc, "grouped": wg[0], "grouped_cooperative": wg[1], "grouped_320": wg[2]}.get(ran) or wc
        if ran:
            wgrad_ran.append(ratio(wb, wr))
        dc, db = find(rs, "dgrad", "comet", "gemm_only"), find(rs, "dgrad", "cublas")
        fc, fs = find(rs, "fwd+bwd", "comet", "fused", paired=True), find(rs, "fwd+bwd", "sequential", paired=True)
        s, c, f = ratio(seq, comet), ratio(chunked, comet), ratio(fs, fc)
        w, d = ratio(wb, wc), ratio(db, dc)
        vs_seq.append(s)
        vs_chunked.append(c)
        wgrad.append(w)
        dgrad.append(d)
        fwd_bwd.append(f)
        chunk_cell = f"{chunked['median_ms']:.3f} ({chunked.get('chunks', '?')})" if chunked else "-"
        tf = lambda a, b: f"{a['tflops']:.0f} / {b['tflops']:.0f}" if a and b else "-"
        wgrad_cell = " / ".join(f"{x['tflops']:.0f}" if x else "-" for x in [wc] + wg + [wb]) if any(wg) \
            else tf(wc, wb)
        if any(wg):
            grouped.append(ratio(wc, min((x for x in wg if x), key=lambda x: x["median_ms"])))
        print(f"| {key[1]} | {key[2]} | {key[3]} | {comet['median_ms']:.3f} | {seq['median_ms']:.3f} | {chunk_cell} | "
              f"{fmt(s, suffix='x')} | {fmt(c, suffix='x')} | {wgrad_cell} | {tf(dc, db)} | {fmt(f, suffix='x')} |")
    print()
    print(summary_line("backward, sequential / comet (paired)", vs_seq))
    how = "in the same rotation" if chunked_paired and all(chunked_paired) else "chunked timed on its own"
    print(summary_line(f"backward, chunked / comet ({how})", vs_chunked))
    print(summary_line("weight gradients, cuBLAS time / comet's persistent kernel's time", wgrad))
    if wgrad_ran:
        print(summary_line("weight gradients, cuBLAS time / the time of the kernel the backward picked", wgrad_ran))
    print(summary_line("data gradients (GEMMs alone), cuBLAS time / comet time", dgrad))
    print(summary_line("forward + backward, sequential / comet (paired)", fwd_bwd))
    if grouped:
        print(summary_line("weight gradients, persistent kernel's time / the faster CUTLASS grouped GEMM's", grouped))


def fused_activation_table(cases):
    pairs = []
    for key in sorted(cases):
        rs = cases[key]
        two, fused = find(rs, "bwd", "comet", "two_pass", True), find(rs, "bwd", "comet", "fused_act", True)
        if two and fused:
            pairs.append((key, ratio(two, fused)))
    if not pairs:
        return
    print("\n### Activation backward in the epilogue (BackwardOptions::fused_activation), paired with two passes\n")
    for link in sorted({k[0] for k, _ in pairs}):
        print(summary_line(f"{link} link, two-pass time / fused time", [r for k, r in pairs if k[0] == link]))


def main(paths):
    # One section per file: records of different runs are never mixed, so that a paired ratio stays one
    # run's rotation.
    print("# comet-bench backward summary\n")
    print("Medians of >= 10 CUDA-event-timed repeats; 'paired' ratios come from runs timed in rotation. "
          "Ratios above 1 favour comet.")
    for path in paths:
        recs = load([path])
        gpu = recs[0].get("gpu", "?") if recs else "?"
        commits = ", ".join(sorted({r.get("commit", "?") for r in recs}))
        print(f"\n## `{path}` ({gpu}, commit {commits})")
        cases = by_case(recs)
        for link in sorted({k[0] for k in cases}):
            link_table(link, cases)
        fused_activation_table(cases)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
