// Random routing for tests: every rank's top-k ids and gate weights, with the ugly cases named.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "comet/plan.hpp"

namespace comet::testing {

enum class RoutingKind {
  uniform,       // k distinct experts uniformly at random
  zipf,          // distinct experts, skewed: expert e drawn with weight 1/(e+1)^1.2
  one_expert,    // every token's first slot is expert `hot` (other slots random, distinct)
  local_only,    // every token chooses experts held by its own EP group (no remote rows in EP)
  one_group,     // every token chooses experts of EP group `hot` only: all rows go to its ranks (k <= E/ep)
};

struct RankRouting {
  int tokens = 0;
  std::vector<int32_t> ids;   // [tokens][k]
  std::vector<float> gates;   // [tokens][k], positive, each row sums to 1
  RoutingView view() const { return RoutingView{tokens, ids.data(), gates.data()}; }
};

// tokens_per_rank[s] tokens for rank s (0 allowed). `hot`: the expert of one_expert, the EP group of one_group.
std::vector<RankRouting> make_routing(const MoeShape& shape, const Parallel& par, const std::vector<int>& tokens_per_rank,
                                      RoutingKind kind, uint64_t seed, int hot = 0);

std::vector<RoutingView> views(const std::vector<RankRouting>& routing);

const char* to_string(RoutingKind kind);

// Random values in [-scale, scale], rounded to bf16 so that fp32 and bf16 copies agree exactly.
std::vector<float> random_bf16_values(size_t n, float scale, uint64_t seed);

}  // namespace comet::testing
