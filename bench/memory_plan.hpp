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

// T_cap tokens and rows_cap gathered rows per rank (a multiple of 128), W = par.world() ranks. Only
// rank 0 computes (MoeOptions::compute_ranks): its private buffers (layer_footprint), weights (shared
// by every rank) and GEMM0 scratch for two baselines; every rank exports its symmetric buffers and
// holds its batch. training: the layer's training buffers and rank 0's gradients (bf16).
MemoryNeed memory_need(const MoeShape& shape, const Parallel& par, Link link, int max_tokens, int max_rows,
                       bool training);

inline double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

}  // namespace comet::bench
