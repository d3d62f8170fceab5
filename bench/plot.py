#!/usr/bin/env python3
"""Plots of comet-bench results (the JSON records of bench/comet_bench.cpp, DESIGN.md section 5).

    python3 bench/plot.py [RESULTS.json ...] [--out-dir DIR]

Without files it takes the newest bench/results/*.json. Several files are merged (a sweep split over
several runs). Writes, into --out-dir (default: the first file's folder, in a subfolder named after it):
  latency_<model>_<link>_<routing>.png   median latency vs tokens per rank; rows: l0, l1, fwd; columns:
                                         layouts; one line per system (comet = best fused n_comm)
  efficiency_<link>_<routing>.png        comet's overlap efficiency T_fused / max(T_gemm, T_comm) vs
                                         tokens, one panel per model, one line per layout and layer
  speedup_<link>_<routing>.png           sequential / comet and chunked / comet per layer, per model
"""
import argparse
import collections
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SYSTEMS = [  # (label, colour, predicate on a record), in legend order; one colour per system everywhere
    ("cublas (GEMM only)", "tab:gray", lambda r: r["system"] == "cublas"),
    ("comet gemm_only", "tab:cyan", lambda r: r["system"] == "comet" and r.get("mode") == "gemm_only"),
    ("comet fused (best n_comm)", "tab:blue",
     lambda r: r["system"] == "comet" and r.get("mode") == "fused" and r.get("best")),
    ("sequential", "tab:red", lambda r: r["system"] == "sequential"),
    ("chunked (best C)", "tab:orange", lambda r: r["system"] == "chunked"),
]
COMET_FUSED = SYSTEMS[2][2]
LAYERS = ["l0", "l1", "fwd"]


def load(paths):
    records = []
    for p in paths:
        with open(p) as f:
            records.extend(json.load(f))
    return records


def newest_results():
    here = os.path.dirname(os.path.abspath(__file__))
    files = sorted(glob.glob(os.path.join(here, "results", "*.json")), key=os.path.getmtime)
    if not files:
        sys.exit("plot.py: no results in bench/results/ (pass the JSON files)")
    return [files[-1]]


def series(records, pred):
    """tokens -> median_ms for the records matching pred (the last one wins on duplicates)."""
    points = {}
    for r in records:
        if pred(r):
            points[r["tokens_per_rank"]] = r["median_ms"]
    xs = sorted(points)
    return xs, [points[x] for x in xs]


def group(records, *keys):
    out = collections.OrderedDict()
    for r in records:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return out


def style_axis(ax, title, ylabel):
    ax.set_title(title, fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per rank", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.tick_params(labelsize=7)


def plot_latency(records, out_dir):
    written = []
    for (model, link, routing), rs in group(records, "model", "link", "routing").items():
        layouts = list(group(rs, "layout"))
        fig, axes = plt.subplots(len(LAYERS), len(layouts), figsize=(4.2 * len(layouts), 3.2 * len(LAYERS)), squeeze=False)
        for col, (layout,) in enumerate(layouts):
            for row, layer in enumerate(LAYERS):
                ax = axes[row][col]
                sub = [r for r in rs if r.get("layout") == layout and r["layer"] == layer]
                for label, colour, pred in SYSTEMS:
                    xs, ys = series(sub, pred)
                    if xs:
                        ax.plot(xs, ys, marker="o", markersize=3, color=colour, label=label)
                style_axis(ax, f"{model} {layout} {layer} ({link} link, {routing})", "median ms")
                ax.set_yscale("log")
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=6)
        fig.tight_layout()
        path = os.path.join(out_dir, f"latency_{model}_{link}_{routing}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_per_model(records, out_dir, name, ylabel, draw, legend_size):
    """One figure per (link, routing): a panel per model, a line per (layout, layer) drawn by `draw`."""
    written = []
    for (link, routing), rs in group(records, "link", "routing").items():
        models = list(group(rs, "model"))
        fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False)
        for col, (model,) in enumerate(models):
            ax = axes[0][col]
            for (layout, layer), lrs in group([r for r in rs if r["model"] == model], "layout", "layer").items():
                draw(ax, layout, layer, lrs)
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
            style_axis(ax, f"{model} ({link} link, {routing})", ylabel)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=legend_size)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{name}_{link}_{routing}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_efficiency(records, out_dir):
    def draw(ax, layout, layer, lrs):
        points = sorted((r["tokens_per_rank"], r["overlap_efficiency"]) for r in lrs
                        if r["system"] == "comet" and r.get("best") and r.get("overlap_efficiency") is not None)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=f"{layout} {layer}")
    return plot_per_model(records, out_dir, "efficiency", "T_fused / max(T_gemm, T_comm)", draw, 6)


def plot_speedup(records, out_dir):
    def draw(ax, layout, layer, lrs):
        comet = dict(zip(*series(lrs, COMET_FUSED)))
        for base, marker in (("sequential", "o"), ("chunked", "s")):
            xs, ys = series(lrs, lambda r, b=base: r["system"] == b)
            pts = [(x, y / comet[x]) for x, y in zip(xs, ys) if comet.get(x)]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, markersize=3,
                        label=f"{layout} {layer} vs {base}")
    return plot_per_model(records, out_dir, "speedup", "baseline time / comet time", draw, 5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="*", help="JSON files written by comet-bench")
    ap.add_argument("--out-dir", help="folder for the PNGs")
    args = ap.parse_args()
    paths = args.results or newest_results()
    records = load(paths)
    if not records:
        sys.exit("plot.py: the results hold no records")
    out_dir = args.out_dir or os.path.splitext(paths[0])[0] + "_plots"
    os.makedirs(out_dir, exist_ok=True)
    written = plot_latency(records, out_dir) + plot_efficiency(records, out_dir) + plot_speedup(records, out_dir)
    for p in written:
        print(p)


if __name__ == "__main__":
    main()
