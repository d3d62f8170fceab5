#include "bench_routing.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "comet/common.hpp"

namespace comet::bench {
namespace {

constexpr int kTileM = 128;  // FusedMoe's M-tile: expert segments are padded to it

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: independent seeds per rank from one seed
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void fill_rank(const MoeShape& shape, int tokens, const std::string& kind, uint64_t seed, testing::RankRouting& r) {
  const int E = shape.num_experts, k = shape.topk;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> any(0, E - 1);
  std::uniform_real_distribution<double> unit01(0.0, 1.0);
  std::uniform_real_distribution<float> gate(0.05f, 1.0f);
  std::vector<double> cdf;
  if (kind == "zipf1.2") {
    double sum = 0;
    for (int e = 0; e < E; ++e) cdf.push_back(sum += 1.0 / std::pow(double(e + 1), 1.2));
    for (double& c : cdf) c /= sum;
  }
  auto draw = [&]() {
    if (cdf.empty()) return any(rng);
    const auto it = std::lower_bound(cdf.begin(), cdf.end(), unit01(rng));
    return int(std::min<std::ptrdiff_t>(it - cdf.begin(), E - 1));
  };
  r.tokens = tokens;
  r.ids.resize(size_t(tokens) * k);
  r.gates.resize(size_t(tokens) * k);
  for (int t = 0; t < tokens; ++t) {
    int32_t* ids = &r.ids[size_t(t) * k];
    for (int j = 0; j < k; ++j) {
      int e;
      do {
        e = (kind == "one_expert" && j == 0) ? 0 : draw();
      } while (std::find(ids, ids + j, e) != ids + j);
      ids[j] = e;
    }
    float* g = &r.gates[size_t(t) * k];
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += (g[j] = gate(rng));
    for (int j = 0; j < k; ++j) g[j] /= sum;
  }
}

}  // namespace

std::vector<testing::RankRouting> make_bench_routing(const MoeShape& shape, int world, int tokens,
                                                     const std::string& kind, uint64_t seed) {
  COMET_REQUIRE(kind == "uniform" || kind == "zipf1.2" || kind == "one_expert", "unknown routing '", kind, "'");
  std::vector<testing::RankRouting> out(world);
  std::vector<std::thread> threads;
  for (int s = 0; s < world; ++s)
    threads.emplace_back([&, s] { fill_rank(shape, tokens, kind, mix(seed * 1000003ull + s), out[s]); });
  for (auto& t : threads) t.join();
  return out;
}

RoutingStats routing_stats(const MoeShape& shape, const Parallel& par, const std::vector<testing::RankRouting>& routing) {
  const int E = shape.num_experts, k = shape.topk, el = par.local_experts(shape);
  std::vector<long long> count(E, 0);
  RoutingStats st;
  for (size_t s = 0; s < routing.size(); ++s) {
    const auto& r = routing[s];
    for (int t = 0; t < r.tokens; ++t) {
      bool on_rank0 = false;
      for (int j = 0; j < k; ++j) {
        const int e = r.ids[size_t(t) * k + j];
        ++count[e];
        on_rank0 |= e < el;  // rank 0 is EP group 0: experts [0, E_l)
      }
      if (on_rank0) {
        ++st.rank0_units;
        if (s != 0) ++st.rank0_remote_units;
      }
    }
  }
  for (int g = 0; g < par.ep; ++g) {
    long long padded = 0;
    for (int e = g * el; e < (g + 1) * el; ++e) padded += (count[e] + kTileM - 1) / kTileM * kTileM;
    COMET_REQUIRE(padded < (1LL << 31) - kTileM, "routing: ", padded, " rows on one rank overflow int32");
    st.max_padded_rows = std::max<int>(st.max_padded_rows, int(std::max(padded, 1LL * kTileM)));
  }
  for (int e = 0; e < el; ++e) st.rank0_rows += count[e];
  return st;
}

}  // namespace comet::bench
