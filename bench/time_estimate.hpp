// A rough model of the benchmark's own device time (what a sweep costs on the H200), from FLOPs and the
// bytes that cross the link, so that a sweep can be planned to fit a time budget before it runs.
#pragma once

#include "bench_options.hpp"
#include "bench_routing.hpp"
#include "comet/shape.hpp"
#include "comet/team.hpp"
#include "memory_plan.hpp"

namespace comet::bench {

struct CaseCost {
  double gemm0_ms = 0, gemm1_ms = 0;  // full-GPU GEMMs of rank 0's problem
  double comm0_ms = 0, comm1_ms = 0;  // the link alone at full speed
  double seconds = 0;                 // everything the benchmark runs for the case, warm-ups included
  int warmup = 0;                     // warm-ups used for each measurement of the case
};

CaseCost estimate_case(const BenchOptions& o, const MoeShape& shape, const Parallel& par, Link link,
                       const RoutingStats& stats);

// Building a group's layer: allocations (pinned host memory is slow to pin and clear), weights.
double estimate_group_setup_seconds(const MemoryNeed& need, const MoeShape& shape, const Parallel& par);

// Process start: CUDA context, module loading, cuBLAS handles.
inline constexpr double kStartupSeconds = 6.0;

}  // namespace comet::bench
