// Problem keys and the expected work behind them.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "comet/common.hpp"
#include "comet/tune.hpp"

namespace comet {

std::string TuneKey::str() const {
  std::ostringstream os;
  os << gpu << '|' << sms << "|l" << layer << '|' << hidden << 'x' << ffn << "|E" << experts << "|k" << topk << "|W"
     << world << "|ep" << ep << "|tp" << tp << '|' << to_string(link) << "|T" << tokens_bucket << '|' << dtype;
  if (load != 1) os << "|load" << load;  // class 1 keeps the key of tables written before load classes
  return os.str();
}

int tokens_bucket(int tokens_per_rank) {
  int b = 256;
  while (b < tokens_per_rank) b *= 2;
  return b;
}

double expected_rows(const MoeShape& s, const Parallel& p, int tokens_per_rank) {
  return double(p.world()) * tokens_per_rank * s.topk / p.ep;
}

LayerWork row_work(const MoeShape& s, const Parallel& p, int layer) {
  COMET_REQUIRE(layer >= 0 && layer < kLaunchLayers, "tuner: launch layer must be 0..3, got ", layer);
  LayerWork w;
  w.layer = comm_kind(layer);
  w.backward = layer >= 2;
  w.hidden = s.hidden;
  w.topk = s.topk;
  const int n0 = int(s.w0_rows() / p.tp), fs = p.ffn_shard(s);
  // (N, K) of the GEMM: layer 0 x W0^T, layer 1 h W1^T, their backwards G W1 and dPre W0.
  const int n[kLaunchLayers] = {n0, s.hidden, fs, s.hidden};
  const int k[kLaunchLayers] = {s.hidden, fs, s.hidden, n0};
  w.gemm_n = n[layer];
  w.flops = 2.0 * n[layer] * k[layer];
  return w;
}

LayerWork expected_work(const MoeShape& s, const Parallel& p, int layer, int tokens_per_rank, int tile_n) {
  const double W = p.world(), T = tokens_per_rank, k = s.topk;
  // Every token of every rank sends k rows, spread evenly over the ep groups; each of the group's tp
  // ranks gets all of them (its F shard).
  const double rows = expected_rows(s, p, tokens_per_rank);
  // A token reaches a group if one of its k distinct experts lives there.
  const double reach = 1.0 - std::pow(1.0 - 1.0 / p.ep, k);
  const double units = W * T * reach, remote_units = (W - 1) * T * reach;
  const double H = s.hidden, Fs = p.ffn_shard(s);
  LayerWork w = row_work(s, p, layer);
  w.link_bytes = remote_units * H * 2;
  w.comm_units = w.layer == 0 ? remote_units : units;
  w.rows_per_unit = units > 0 ? rows / units : 1;
  w.flops *= rows;  // row_work's flops are one row's
  (void)tile_n;
  return w;
}

}  // namespace comet
