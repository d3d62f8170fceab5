#!/usr/bin/env python3
"""Layer 0's fan-out: how many gathered rows each pulled unit fills.

The plan pulls each unit (a source rank's token with at least one expert on this rank) across the link
once and stores it into one row per local expert the token chose (include/comet/plan.hpp). Fan-out is
rows / units: the stores each pull makes into HBM. This prints it for the benchmark's models and
routings (bench/bench_routing.cpp: k distinct experts per token, uniform or Zipf 1.2 over the expert ids,
experts split over EP ranks in order), on rank 0 (the rank the benchmark times, which holds the hottest
experts under Zipf) and over all ranks, with rank 0's rows against the mean. Same distributions as the
benchmark, not its random stream, so the figures match its batches in expectation only.

  python3 bench/unit_fanout.py [--tokens 4096] [--ep 8] [--seed 1]
"""
import argparse
import bisect
import random

MODELS = {  # name: (experts, top-k), as bench/models.cpp
    "mixtral": (8, 2),
    "phi35": (16, 2),
    "qwen2": (64, 4),
    "qwen57": (64, 8),
    "deepseek": (256, 8),
}


def draw_token(rng, cdf, experts, k):
    ids = []
    while len(ids) < k:
        e = min(bisect.bisect_left(cdf, rng.random()), experts - 1)
        if e not in ids:
            ids.append(e)
    return ids


def expert_cdf(experts, routing):
    """The cumulative distribution of a token's expert choice: uniform, or Zipf 1.2 over the expert ids."""
    weights = [1.0] * experts if routing == "uniform" else [1 / (e + 1) ** 1.2 for e in range(experts)]
    total, acc, cdf = sum(weights), 0.0, []
    for w in weights:
        acc += w / total
        cdf.append(acc)
    return cdf


def ratios(experts, k, routing, tokens, ep, rng):
    cdf = expert_cdf(experts, routing)
    per_rank = experts // ep
    rows, units = [0] * ep, [0] * ep
    for _ in range(tokens * ep):  # every rank's tokens: rank 0 gathers from all of them
        ranks = [e // per_rank for e in draw_token(rng, cdf, experts, k)]
        for r in set(ranks):
            rows[r] += ranks.count(r)
            units[r] += 1
    mean_rows = tokens * ep * k / ep
    return rows[0] / units[0], rows[0] / mean_rows, sum(rows) / sum(units)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    ap.add_argument("--ep", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print(f"EP {a.ep}, {a.tokens} tokens per rank: rows / units (fan-out)")
    for name, (experts, k) in MODELS.items():
        for routing in ("uniform", "zipf1.2"):
            r0, load0, every = ratios(experts, k, routing, a.tokens, a.ep, rng)
            print(f"  {name:9s} {routing:8s} rank 0 {r0:.2f} (its rows {load0:.1f}x the mean)  all ranks {every:.2f}")


if __name__ == "__main__":
    main()
