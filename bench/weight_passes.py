#!/usr/bin/env python3
"""Layer 0's weight passes in the fused launch's tile order: a model, not a measurement.

Rank 0 of EP ranks (the rank the benchmark times) under the benchmark's routing distributions
(bench/unit_fanout.py's draws: k distinct experts per token, uniform or Zipf 1.2 over the expert ids,
experts split over the ranks in order). Its gathered rows follow the plan (include/comet/plan.hpp): each
local expert's segment holds its rows source by source (position 0, the rank itself, first), padded to
whole M-tiles; a tile's wave is the source position of its last remote row (0: all local); with
wave_chunk N its order wave is the latest wave of its chunk (its expert's tiles cut into runs of N from
the first). The compute blocks take the tiles sorted by (order wave, m) in rasterisation groups of
--m-group consecutive tiles, every column block of a group's tiles at about the same time; a group
reads the weights of each expert it holds about once. Printed: M-tiles, the tiles each chunk moves to
a later wave, and the (group, expert) pairs, i.e. the expert weight passes, for each chunk and for m
order (the GEMM alone's order). DeepSeek-V3's W0 is 58.7 MB an expert, more than the H100's L2.

  python3 bench/weight_passes.py [--tokens 1024] [--ep 8] [--m-group 8] [--tile-m 128] [--seed 1]
"""
import argparse
import random

from unit_fanout import MODELS, draw_token, expert_cdf


def segments(experts, k, routing, tokens, ep, rng):
    """rows[e][j]: rank 0's rows of local expert e from source position j (source rank j for rank 0)."""
    cdf = expert_cdf(experts, routing)
    local = experts // ep
    rows = [[0] * ep for _ in range(local)]
    for j in range(ep):
        for _ in range(tokens):
            for e in draw_token(rng, cdf, experts, k):
                if e < local:
                    rows[e][j] += 1
    return rows


def tiles_of(rows, tile_m):
    """(expert, wave) of every M-tile in m order."""
    tiles = []
    for e, per_source in enumerate(rows):
        count = (sum(per_source) + tile_m - 1) // tile_m
        for m in range(count):
            lo, hi = m * tile_m, min((m + 1) * tile_m, sum(per_source)) - 1
            start, wave = 0, 0
            for j, n in enumerate(per_source):
                if n and j > 0 and start <= hi and start + n - 1 >= lo:
                    wave = j
                start += n
            tiles.append((e, wave))
    return tiles


def order(tiles, chunk):
    """Tile indices sorted by (order wave, m), and how many tiles the chunks moved to a later wave."""
    by_expert = {}
    for i, (e, _) in enumerate(tiles):
        by_expert.setdefault(e, []).append(i)
    order_wave = {}
    for idx in by_expert.values():
        for p, i in enumerate(idx):
            if tiles[i][1] == 0:
                order_wave[i] = 0
                continue
            lo = p // chunk * chunk
            order_wave[i] = max(tiles[c][1] for c in idx[lo:lo + chunk])
    moved = sum(1 for i in order_wave if order_wave[i] > tiles[i][1])
    return sorted(range(len(tiles)), key=lambda i: (order_wave[i], i)), moved


def passes(tiles, sequence, m_group):
    return sum(len({tiles[i][0] for i in sequence[g:g + m_group]}) for g in range(0, len(sequence), m_group))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per rank")
    ap.add_argument("--ep", type=int, default=8)
    ap.add_argument("--m-group", type=int, default=8, help="M-tiles per rasterisation group")
    ap.add_argument("--tile-m", type=int, default=128)
    ap.add_argument("--chunks", default="1,2,4,8")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    chunks = [int(c) for c in a.chunks.split(",")]
    print(f"EP {a.ep}, {a.tokens} tokens per rank, tile_m {a.tile_m}, groups of {a.m_group}: rank 0's "
          f"weight passes (moved: tiles a chunk puts in a later wave)")
    for name, (experts, k) in MODELS.items():
        if experts // a.ep < 2:
            continue  # one local expert: one set of weights whatever the order
        for routing in ("uniform", "zipf1.2"):
            rng = random.Random(a.seed)
            tiles = tiles_of(segments(experts, k, routing, a.tokens, a.ep, rng), a.tile_m)
            cells = []
            for c in chunks:
                seq, moved = order(tiles, c)
                cells.append(f"chunk {c}: {passes(tiles, seq, a.m_group):4d} ({moved} moved)")
            m_order = passes(tiles, list(range(len(tiles))), a.m_group)
            print(f"  {name:9s} {routing:8s} {len(tiles):5d} tiles  m order {m_order:4d}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
