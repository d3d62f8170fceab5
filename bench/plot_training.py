#!/usr/bin/env python3
"""Plots the loss curves examples/train_moe.py writes: the model with comet's MoE layers and the same
model with a plain PyTorch MoE, from the same initial weights on the same data.

    python3 bench/plot_training.py [CURVES.json] [--out PNG]

CURVES.json defaults to bench/results/h200_training_curves.json, the PNG to the same path with .png.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CURVES = {  # key in the JSON -> label, style (the plain curve wide and pale, so comet's shows on top of it)
    "plain": ("plain PyTorch MoE", dict(color="tab:gray", linewidth=3, alpha=0.6)),
    "comet": ("comet.MoELayer", dict(color="tab:blue", linewidth=1.2)),
}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("curves", nargs="?", default=os.path.join(here, "results", "h200_training_curves.json"))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    with open(a.curves) as f:
        run = json.load(f)

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, (label, style) in CURVES.items():
        ax.plot(range(1, len(run[key]) + 1), run[key], label=label, **style)
    c = run["config"]
    ax.set(xlabel="step", ylabel="training loss (MSE)", yscale="log",
           title=f"H {c['hidden']}, F {c['ffn']}, {c['experts']} experts top-{c['top_k']}, {c['layers']} MoE layers, "
                 f"EP {c['world']}\nlargest relative difference of the losses {run['max_rel_diff']:.2e}")
    ax.title.set_fontsize(9)
    ax.legend()
    fig.tight_layout()
    out = a.out or os.path.splitext(a.curves)[0] + ".png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
