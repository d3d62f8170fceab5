#include "harness/routing_gen.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "comet/bf16.hpp"

namespace comet::testing {

namespace {

// Draws k distinct experts from `candidates` with the given weights (weights may be all equal).
void draw_distinct(std::mt19937_64& rng, std::vector<int> candidates, std::vector<double> weights, int k,
                   int32_t* out) {
  for (int j = 0; j < k; ++j) {
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    int i = pick(rng);
    out[j] = candidates[i];
    candidates.erase(candidates.begin() + i);
    weights.erase(weights.begin() + i);
  }
}

}  // namespace

std::vector<RankRouting> make_routing(const MoeShape& shape, const Parallel& par, const std::vector<int>& tokens_per_rank,
                                      RoutingKind kind, uint64_t seed, int hot) {
  const int E = shape.num_experts, k = shape.topk;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.05f, 1.0f);
  std::vector<RankRouting> out(tokens_per_rank.size());
  for (size_t s = 0; s < tokens_per_rank.size(); ++s) {
    RankRouting& r = out[s];
    r.tokens = tokens_per_rank[s];
    r.ids.resize(size_t(r.tokens) * k);
    r.gates.resize(size_t(r.tokens) * k);
    for (int t = 0; t < r.tokens; ++t) {
      int32_t* ids = &r.ids[size_t(t) * k];
      std::vector<int> cand;
      std::vector<double> w;
      if (kind == RoutingKind::local_only || kind == RoutingKind::one_group) {
        const int El = par.local_experts(shape);
        const int g = kind == RoutingKind::local_only ? par.ep_index(int(s)) : hot;
        for (int e = g * El; e < (g + 1) * El; ++e) cand.push_back(e);
      } else {
        for (int e = 0; e < E; ++e) cand.push_back(e);
      }
      for (int e : cand) w.push_back(kind == RoutingKind::zipf ? 1.0 / std::pow(double(e + 1), 1.2) : 1.0);
      if (kind == RoutingKind::one_expert) {
        ids[0] = hot;
        auto it = std::find(cand.begin(), cand.end(), hot);
        w.erase(w.begin() + (it - cand.begin()));
        cand.erase(it);
        draw_distinct(rng, cand, w, k - 1, ids + 1);
      } else {
        draw_distinct(rng, cand, w, k, ids);
      }
      float sum = 0;
      for (int j = 0; j < k; ++j) sum += (r.gates[size_t(t) * k + j] = unit(rng));
      for (int j = 0; j < k; ++j) r.gates[size_t(t) * k + j] /= sum;
    }
  }
  return out;
}

std::vector<RoutingView> views(const std::vector<RankRouting>& routing) {
  std::vector<RoutingView> v;
  for (const auto& r : routing) v.push_back(r.view());
  return v;
}

const char* to_string(RoutingKind kind) {
  switch (kind) {
    case RoutingKind::uniform: return "uniform";
    case RoutingKind::zipf: return "zipf";
    case RoutingKind::one_expert: return "one_expert";
    case RoutingKind::local_only: return "local_only";
    case RoutingKind::one_group: return "one_group";
  }
  return "?";
}

std::vector<float> random_bf16_values(size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to_bf16(d(rng));
  return v;
}

}  // namespace comet::testing
