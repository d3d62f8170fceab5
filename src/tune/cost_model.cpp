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

double CostModel::predict_ms(const LayerWork& w, int n_comm, int sms) const {
  const double t_gemm = w.flops / (gemm_tflops_per_sm * 1e12 * std::max(1, sms - n_comm)) * 1e3;
  double t_comm = 0;
  if (w.link_bytes > 0 && w.link_rows > 0) {
    const double row_us = w.layer == 0 ? l0_row_us : l1_row_us;
    const double block = (w.link_bytes / w.link_rows) / (row_us * 1e-6);  // bytes/s of one block
    const double n_blocks = std::max(1, n_comm) * block, ceiling = link_gbps * 1e9;
    const double rate = std::pow(std::pow(n_blocks, -4.0) + std::pow(ceiling, -4.0), -0.25);
    t_comm = w.link_bytes / rate * 1e3;
  }
  return std::max(t_gemm, t_comm) + overlap_penalty * std::min(t_gemm, t_comm);
}

int CostModel::best_n_comm(const LayerWork& w, int sms) const {
  std::vector<int> candidates;
  for (int n : {2, 4, 8, 16, 32})
    if (n <= std::max(2, sms * 2 / 5)) candidates.push_back(n);
  double best_ms = 1e300;
  for (int n : candidates) best_ms = std::min(best_ms, predict_ms(w, n, sms));
  for (int n : candidates)  // the fewest blocks among equals: leave SMs to the GEMM
    if (predict_ms(w, n, sms) <= best_ms * 1.01) return n;
  return candidates.front();
}

}  // namespace comet
