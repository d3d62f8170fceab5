// The cost model: a fused layer takes the longer of its GEMM on the compute blocks and its transfer
// on the comm blocks, plus the part that cannot overlap (layer 0: the tiles computed after their rows
// land; layer 1: the first column group computed before anything ships, the last one shipped after).
#include <algorithm>

#include "comet/tune.hpp"

namespace comet {

CostModel CostModel::defaults(Link link) {
  CostModel m;
  if (link == Link::device) {  // HBM to HBM through the comm blocks: no link ceiling worth the name
    m.l0_block_gbps = 40.0;
    m.l1_block_gbps = 20.0;
    m.link_gbps = 2000.0;
  }
  return m;
}

double CostModel::predict_ms(const LayerWork& w, int n_comm, int sms) const {
  const int compute = std::max(1, sms - n_comm);
  const double t_gemm = w.flops / (gemm_tflops_per_sm * 1e12 * compute) * 1e3;
  const double block = w.layer == 0 ? l0_block_gbps : l1_block_gbps;
  const double rate = std::min(link_gbps, block * std::max(1, n_comm)) * 1e9;
  const double t_comm = w.link_bytes / rate * 1e3;
  if (w.layer == 0) {
    // The last rows land at t_comm; a few tiles are computed after that.
    return std::max(t_gemm, t_comm + t_gemm * 0.02);
  }
  const double g = std::max(1, w.column_groups);
  return std::max(t_gemm + t_comm / g, t_comm + t_gemm / g);
}

int CostModel::best_n_comm(const LayerWork& w, int sms) const {
  const int most = std::max(1, sms * 2 / 5);
  int best = 1;
  double best_ms = predict_ms(w, 1, sms);
  for (int n = 2; n <= most; ++n) {
    const double t = predict_ms(w, n, sms);
    if (t < best_ms * 0.999) {  // the fewest blocks among equals: leave SMs to the GEMM
      best = n;
      best_ms = t;
    }
  }
  return best;
}

}  // namespace comet
