#!/usr/bin/env python3
"""Where a fused layer-0 launch spends its time: reads comet-bench --trace files (bench/layer0_trace.hpp).

For each case and n_comm it sets the traced fused launch beside the comm blocks alone and the GEMM alone
(each traced once, right after the sweep that timed them):
  span      the launch's first block start to its last block end (ms)
  comm      the comm blocks' last end: fused, and alone (comm_only)
  ready50/90/100  when half / 90 % / all of the M-tiles with remote rows were released (fused)
  alone90   the same 90 % mark with the comm blocks alone
  stall     compute blocks' time waiting for rows, as a share of their time in the launch
  tail      span - the last release: the GEMM left after the last row landed
  item      the median time a compute block spends on one (M-tile, N-block), fused / GEMM alone (us):
            above 1x the fused GEMM runs slower than alone (its weights re-read, a smaller grid)
  gemm      the GEMM alone's span (every row present, the full grid)
The question it answers: does the pull slow down beside the GEMM (comm fused >> alone), or does the GEMM
wait for rows it could have had (stall high while the pull ends early)?

  python3 bench/trace_timeline.py TRACE_DIR_OR_FILES... [--tiles]   (--tiles: per M-tile ready / wait)
"""
import json
import os
import sys


def quantile(values, q):
    v = sorted(values)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def ms(ns):
    return ns / 1e6


def run_summary(trace, run):
    n_comm = run["n_comm"] if run["mode"] != "gemm_only" else 0
    starts, ends = run["block_start"], run["block_end"]
    span = max(ends)
    comm_end = max([ends[b] for b in range(n_comm) if ends[b] >= 0], default=-1)
    remote = [m for m in range(trace["num_tiles"]) if trace["tile_remote_rows"][m] > 0]
    ready = [run["ready"][m] for m in remote if run["ready"][m] >= 0]
    s = {"span": span, "comm": comm_end}
    for q in (0.5, 0.9, 1.0):
        s["ready%d" % int(q * 100)] = quantile(ready, q)
    if run["mode"] != "comm_only":
        stall = sum(e - b for b, e in zip(run["wait_begin"], run["wait_end"]) if b >= 0 and e >= 0)
        in_launch = sum(ends[b] - max(starts[b], 0) for b in range(n_comm, len(ends)) if ends[b] >= 0)
        s["stall"] = stall / in_launch if in_launch else float("nan")
        # Each compute block's items in the order it ran them: item i busy from its wait's end to the
        # next item's wait begin (the producer runs a few K-tiles ahead of the MMAs, so that is about
        # the item's compute); the last item of a block until the block's end.
        per_block = {}
        for i, blk in enumerate(run["wait_block"]):
            if blk >= 0:
                per_block.setdefault(blk, []).append(i)
        item_ns = []
        for blk, items in per_block.items():
            items.sort(key=lambda i: run["wait_end"][i])
            for a, b in zip(items, items[1:]):
                item_ns.append(run["wait_begin"][b] - run["wait_end"][a])
            item_ns.append(ends[blk] - run["wait_end"][items[-1]])
        s["item"] = quantile(item_ns, 0.5)
    return s


def load(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".json"))
        else:
            files.append(p)
    return [(f, json.load(open(f))) for f in files]


def main(argv):
    tiles = "--tiles" in argv
    paths = [a for a in argv if not a.startswith("--")]
    if not paths:
        print(__doc__)
        return 2
    print("| case | n_comm | timed fused ms | span | comm fused | comm alone | ready50 | ready90 | ready100 | alone90 "
          "| stall | tail | item fused / alone us | gemm alone |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path, t in load(paths):
        case = "%s %s %s %s %d (%s%s)" % (t["model"], t["layout"], t["link"], t["routing"], t["tokens"],
                                          t["pull_order"], ", chunk %d" % t["wave_chunk"] if t.get("wave_chunk") else "")
        runs = {(r["mode"], r["n_comm"]): r for r in t["runs"]}
        gemm = runs.get(("gemm_only", 0))
        gs = run_summary(t, gemm) if gemm else {"span": -1, "item": float("nan")}
        g = gs["span"]
        for (mode, n), r in sorted(runs.items(), key=lambda kv: kv[0][1]):
            if mode != "fused":
                continue
            f = run_summary(t, r)
            alone = runs.get(("comm_only", n))
            a = run_summary(t, alone) if alone else {"comm": -1, "ready90": -1}
            print("| %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.3f | %.1f / %.1f | %.3f |" % (
                case, n, r["median_ms"], ms(f["span"]), ms(f["comm"]), ms(a["comm"]), ms(f["ready50"]),
                ms(f["ready90"]), ms(f["ready100"]), ms(a["ready90"]), f["stall"], ms(f["span"] - f["ready100"]),
                f["item"] / 1e3, gs["item"] / 1e3, ms(g)))
            if tiles:
                nb = t["n_blocks"]
                print("  m: expert rows remote | ready fused / alone | first wait begin, last wait end (fused)")
                for m in range(t["num_tiles"]):
                    wb = [r["wait_begin"][m * nb + k] for k in range(nb) if r["wait_begin"][m * nb + k] >= 0]
                    we = [r["wait_end"][m * nb + k] for k in range(nb) if r["wait_end"][m * nb + k] >= 0]
                    print("  %d: %d %d %d | %.3f / %.3f | %.3f %.3f" % (
                        m, t["tile_expert"][m], t["tile_rows"][m], t["tile_remote_rows"][m], ms(r["ready"][m]),
                        ms(alone["ready"][m]) if alone else -1, ms(min(wb, default=-1)), ms(max(we, default=-1))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
