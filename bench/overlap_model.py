#!/usr/bin/env python3
"""Layer 0's overlap, modelled from the routing: when each M-tile's rows are all in, and what a compute
schedule that waits for them then costs.

The fused layer 0 computes an M-tile only once every one of its rows has landed. A pulled unit (a source
rank's token) fills one row per local expert the token chose: under Zipf 1.2 a hot rank of DeepSeek-V3
EP 8 gets 5.7 rows per unit. Tiles therefore complete late whatever the pull order: pulled expert by
expert (the plan's PullOrder::expert), an expert's tiles need every unit that has a row in it, and the
first experts in the order need most of the pull; pulled source by source, each expert's rows arrive
over all W - 1 sources (linear in time), but the compute then takes every expert's weights once per
wave. This models both on rank 0 of the benchmark's routing (bench/unit_fanout.py's distributions, the
plan's row layout of include/comet/plan.hpp) and prints, per case, the GEMM alone, the pull alone and
the modelled fused launch for each order:

  pull        the remote units land in pull order at the link's rate (T_comm = units x 2H / link)
  readiness   a tile is ready when its last unit has landed
  compute     the (M-tile, N-block) items in the launch's order (m_group tiles a group, N-major),
              dealt round-robin to the compute blocks (compute_role.cuh); an item takes its share of
              the GEMM at the measured rate, or longer where its window of concurrent items reads
              more distinct weight slabs and A tiles from HBM than the window's compute time covers
  orders      expert: the remote units by first row, tiles in m order (the library's default)
              size: expert by expert, smallest expert first (comet-bench --expert-order size)
              source: unit order, tiles by (wave, m) in chunks of --chunk (the wave order)

It reproduced the H100's expert-order fused times within about 10 % (DeepSeek-V3 EP 8 Zipf 1024: 5.2
against 5.8 ms; 4096: 19.9 against 20.8; Qwen2-57B EP 8 Zipf 1024 2.3 against 2.4-2.5; 4096 9.2 against
9.8; bench/results/h100_pull_order_53f9057/call2/sweep_expert.json). Its source-order figures at 1024
tokens are far below what the H100 measured (4-5 against 6.9-7.0 ms): the weight traffic of the wave
order is worse than its window model. A model for design, not a measurement.

  python3 bench/overlap_model.py [--models deepseek,qwen57] [--tokens 1024,4096] [--ep 4 --tp 2] [--n-comm 8]
                                 [--chunk 4]
"""
import argparse
import math
import random

from unit_fanout import MODELS, draw_token, expert_cdf

SHAPES = {"mixtral": (4096, 28672), "phi35": (4096, 12800), "qwen2": (2048, 2816), "qwen57": (3584, 5120),
          "deepseek": (7168, 4096)}  # H, rows of W0 per expert (2 F for SwiGLU), as bench/models.cpp
TILE_M, TILE_N = 128, 256


def rank0_layout(experts, k, routing, tokens, ep, tp, rng):
    """Rank 0's units (source, [local experts]) and M-tiles (local expert, [units]), plan.hpp's layout:
    expert segments, inside each the rows by source position, then token. W = ep x tp sources; rank 0
    holds experts [0, E / ep) (with tp > 1 a shard of each, as its tp - 1 peers in the group do)."""
    cdf = expert_cdf(experts, routing)
    local = experts // ep
    units = []
    for src in range(ep * tp):
        for _ in range(tokens):
            here = sorted(e for e in draw_token(rng, cdf, experts, k) if e < local)
            if here:
                units.append((src, here))
    rows = {e: [] for e in range(local)}
    for u, (_, here) in enumerate(units):
        for e in here:
            rows[e].append(u)
    tiles = [(e, rows[e][i:i + TILE_M]) for e in range(local) for i in range(0, len(rows[e]), TILE_M)]
    return units, tiles


def expert_rank(tiles, order):
    """Each local expert's place in an expert-by-expert order: by index (expert), or smallest first by
    rows, ties by index (size: comet-bench --expert-order size)."""
    rows = {}
    for e, us in tiles:
        rows[e] = rows.get(e, 0) + len(us)
    ranked = sorted(rows, key=lambda e: (rows[e], e) if order == "size" else e)
    return {e: r for r, e in enumerate(ranked)}


def tile_ready(units, tiles, order):
    """Each tile's readiness as a fraction of the pull (0: all rows local), and the pull's length."""
    remote = [u for u, (src, _) in enumerate(units) if src != 0]
    if order in ("expert", "size"):  # by (rank of the unit's first expert in the order, its row there)
        rank, key = expert_rank(tiles, order), {}
        for t, (e, us) in enumerate(tiles):
            for j, u in enumerate(us):
                key[u] = min(key.get(u, (len(rank), 0, 0)), (rank[e], t, j))
        remote.sort(key=lambda u: key[u])
    position = {u: p for p, u in enumerate(remote)}
    ready = []
    for _, us in tiles:
        p = [position[u] for u in us if u in position]
        ready.append((max(p) + 1) / len(remote) if p else 0.0)
    return ready, len(remote)


def tile_order(units, tiles, ready, order, chunk):
    """The launch's tile order: expert: all-local tiles, then m order; source: (wave, m), an expert's
    tiles in chunks at the wave of the chunk's last tile."""
    idx = range(len(tiles))
    if order in ("expert", "size"):
        rank = expert_rank(tiles, order)
        return sorted(idx, key=lambda t: (ready[t] > 0, rank[tiles[t][0]] if ready[t] > 0 else 0, t))
    wave = [max((units[u][0] for u in tiles[t][1] if units[u][0] != 0), default=0) for t in idx]
    by_expert = {}
    for t in idx:
        by_expert.setdefault(tiles[t][0], []).append(t)
    order_wave = [0] * len(tiles)
    for ts in by_expert.values():
        for j, t in enumerate(ts):
            last = ts[min(len(ts) - 1, (j // chunk + 1) * chunk - 1)]
            order_wave[t] = wave[last] if wave[t] else 0
    return sorted(idx, key=lambda t: (order_wave[t], t))


def launch_ms(tiles, ready_ms, order, n_blocks, t_gemm, n_compute, hidden, m_group, grid=132, hbm=3.0e12):
    items = []
    for g in range(0, len(order), m_group):
        group = order[g:g + m_group]
        items += [(m, n) for n in range(n_blocks) for m in group]
    item = t_gemm * grid / len(items)  # ms an item takes at the GEMM alone's rate
    slab, a_tile = TILE_N * hidden * 2, TILE_M * hidden * 2
    duration = []
    for w in range(0, len(items), n_compute):  # the items that run side by side
        window = items[w:w + n_compute]
        bytes_read = len({(tiles[m][0], n) for m, n in window}) * slab + len({m for m, _ in window}) * a_tile
        duration += [max(item, bytes_read / hbm * 1e3)] * len(window)
    free = [0.0] * n_compute
    for w, (m, _) in enumerate(items):
        b = w % n_compute
        free[b] = max(free[b], ready_ms[m]) + duration[w]
    return max(free)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="deepseek,qwen57,qwen2,mixtral")
    ap.add_argument("--routings", default="zipf1.2,uniform")
    ap.add_argument("--tokens", default="1024,4096")
    ap.add_argument("--ep", type=int, default=8)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--n-comm", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=1, help="the source order's wave chunk")
    ap.add_argument("--m-group", type=int, default=4)
    ap.add_argument("--tflops", type=float, default=740, help="the GEMM alone's rate")
    ap.add_argument("--link-gbs", type=float, default=47, help="the pull's rate (host link: 47 on the H100)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    print("| model | tokens | routing | units | rows | GEMM alone | pull alone | ideal max | expert | size "
          "| source (chunk %d) |" % a.chunk)
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        experts, k = MODELS[name]
        hidden, n0 = SHAPES[name]
        n0 //= a.tp
        for tokens in (int(t) for t in a.tokens.split(",")):
            for routing in a.routings.split(","):
                units, tiles = rank0_layout(experts, k, routing, tokens, a.ep, a.tp, random.Random(a.seed))
                rows = sum(len(us) for _, us in tiles)
                t_gemm = rows * 2 * hidden * n0 / (a.tflops * 1e12) * 1e3
                fused = {}
                for order in ("expert", "size", "source"):
                    ready, pulled = tile_ready(units, tiles, order)
                    t_comm = pulled * hidden * 2 / (a.link_gbs * 1e9) * 1e3
                    fused[order] = launch_ms(tiles, [r * t_comm for r in ready],
                                             tile_order(units, tiles, ready, order, a.chunk),
                                             math.ceil(n0 / TILE_N), t_gemm, 132 - a.n_comm, hidden, a.m_group)
                ideal = max(t_gemm * 132 / (132 - a.n_comm), t_comm)
                print("| %s | %d | %s | %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
                    name, tokens, routing, len(units), rows, t_gemm, t_comm, ideal, fused["expert"], fused["size"],
                    fused["source"]))


if __name__ == "__main__":
    main()
