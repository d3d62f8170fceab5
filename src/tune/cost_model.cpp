// The cost model (tune.hpp has its formulas and where its constants come from).
#include <algorithm>
#include <cmath>
#include <vector>

#include "comet/tune.hpp"

namespace comet {

CostModel CostModel::defaults(Link link) {
  CostModel m;
  if (link == Link::device) m.link_gbps = 1000.0;  // HBM to HBM: the blocks' own rate is the limit
  return m;
}

double CostModel::unit_us(const LayerWork& w) const {
  if (w.layer == 0) return l0_unit_us + w.rows_per_unit * w.hidden * 2.0 / (l0_store_gbps * 1e3);
  return l1_slice_us * std::ceil(w.hidden / 256.0) * w.topk / 16.0;
}

double CostModel::tile_factor(const LayerWork& w, int tile_n) const {
  if (tile_n == 256 || w.gemm_n <= 0) return 1.0;
  auto padded = [&](int tile) { return double((w.gemm_n + tile - 1) / tile * tile); };
  return padded(tile_n) / padded(256) / (tile_n == 192 ? tile192_efficiency : tile128_efficiency);
}

int CostModel::best_tile_n(const LayerWork& w) const {
  int best = 256;  // among equals the widest tile
  for (int t : {192, 128}) {
    if (t == 192 && w.layer != 0) continue;  // compiled for layer 0 only
    if (tile_factor(w, t) < tile_factor(w, best)) best = t;
  }
  return best;
}

double CostModel::predict_ms(const LayerWork& w, int n_comm, int sms, int tile_n) const {
  // Sequential mode (n_comm 0): the communication on every SM, then the GEMM on every SM.
  const int gemm_sms = n_comm == 0 ? sms : std::max(1, sms - n_comm);
  const double t_gemm = w.flops * tile_factor(w, tile_n) / (gemm_tflops_per_sm * 1e12 * gemm_sms) * 1e3;
  double t_comm = 0;
  if (w.comm_units > 0) {
    const double t_blocks = w.comm_units * unit_us(w) / (n_comm == 0 ? sms : n_comm) * 1e-3;
    const double t_link = w.link_bytes / (link_gbps * 1e9) * 1e3;
    t_comm = std::pow(std::pow(t_blocks, 4.0) + std::pow(t_link, 4.0), 0.25);
  }
  if (n_comm == 0) return t_gemm + t_comm;
  return std::max(t_gemm, t_comm) + overlap_penalty * std::min(t_gemm, t_comm);
}

int CostModel::best_n_comm(const LayerWork& w, int sms, int tile_n) const {
  std::vector<int> candidates;
  for (int n : {2, 4, 8, 16, 24, 32})
    if (n <= std::max(2, sms * 2 / 5)) candidates.push_back(n);
  double best_ms = 1e300;
  for (int n : candidates) best_ms = std::min(best_ms, predict_ms(w, n, sms, tile_n));
  // Sequential mode only where the model sees a clear win (its overlap term is the least certain part):
  // a fast link whose transfer is bound by the blocks' own rate, not by the link.
  if (w.comm_units > 0 && predict_ms(w, 0, sms, tile_n) < best_ms * (1.0 - sequential_margin)) return 0;
  for (int n : candidates)  // the fewest blocks among equals: leave SMs to the GEMM
    if (predict_ms(w, n, sms, tile_n) <= best_ms * 1.01) return n;
  return candidates.front();
}

}  // namespace comet
