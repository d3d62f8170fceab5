// How much memory one constructed layer (LocalTeam + FusedMoe + baselines + the benchmark's own data)
// takes, so that a (model, layout, link) group is built once at the largest capacity that fits and the
// cases that would not fit are skipped with a message instead of failing in cudaMalloc.
#pragma once

#include "comet/shape.hpp"
#include "comet/team.hpp"

namespace comet::bench {

struct MemoryNeed {
  double device_bytes = 0;
  double host_pinned_bytes = 0;  // link=host: every rank's exported buffers
};

// T_cap tokens and rows_cap gathered rows per rank, W = par.world() ranks, weights for rank 0 only
// (the other ranks share them: only rank 0 computes), GEMM0 scratch for two baselines on rank 0.
// training: the layer's training buffers on every rank and rank 0's gradients (bf16 weight gradients).
MemoryNeed memory_need(const MoeShape& shape, const Parallel& par, Link link, int max_tokens, int max_rows,
                       bool training);

inline double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

}  // namespace comet::bench
