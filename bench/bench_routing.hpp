// Routing for the benchmark, made on the host (the only data that is): every rank's top-k ids and gates,
// and what the capacity and the metrics need from it, counted straight from the plan's definitions
// (plan.hpp) instead of building W host plans per case.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comet/shape.hpp"
#include "harness/routing_gen.hpp"

namespace comet::bench {

// kind: "uniform" (k distinct experts, uniform), "zipf1.2" (expert e drawn with weight 1/(e+1)^1.2,
// distinct), "one_expert" (slot 0 is expert 0, the others uniform). Drawing with replacement and
// rejecting repeats gives the same distribution as routing_gen's draws without replacement; it is
// fast enough for 8 x 16384 tokens of top-8 over 256 experts. One thread per rank.
std::vector<testing::RankRouting> make_bench_routing(const MoeShape& shape, int world, int tokens,
                                                     const std::string& kind, uint64_t seed);

struct RoutingStats {
  int max_padded_rows = 0;       // most rows of any rank's gathered buffer, padding to 128 per expert included
  long long rank0_rows = 0;      // rank 0's real rows (GEMM M, summed over its experts)
  long long rank0_units = 0;     // tokens with at least one expert on rank 0, over all sources
  long long rank0_remote_units = 0;  // of those, owned by other ranks: rows that cross the link (each once)
};

RoutingStats routing_stats(const MoeShape& shape, const Parallel& par, const std::vector<testing::RankRouting>& routing);

}  // namespace comet::bench
