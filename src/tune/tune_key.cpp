// Problem keys and the expected work behind them.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "comet/common.hpp"
#include "comet/fp8.hpp"
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

LayerWork row_work(const MoeShape& s, const Parallel& p, int layer, DType dtype) {
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
  // Layer 0 in e4m3 pulls one packed record per unit and multiplies codes; every other launch moves bf16
  // rows of H (a combined output row, a gradient row).
  w.fp8 = layer == 0 && dtype == DType::e4m3;
  w.row_bytes = w.fp8 ? double(fp8::record_bytes(s.hidden)) : 2.0 * s.hidden;
  return w;
}

LayerWork expected_work(const MoeShape& s, const Parallel& p, int layer, int tokens_per_rank, int tile_n,
                        DType dtype) {
  const double W = p.world(), T = tokens_per_rank, k = s.topk;
  // Every token of every rank sends k rows, spread evenly over the ep groups; each of the group's tp
  // ranks gets all of them (its F shard).
  const double rows = expected_rows(s, p, tokens_per_rank);
  // A token reaches a group if one of its k distinct experts lives there.
  const double reach = 1.0 - std::pow(1.0 - 1.0 / p.ep, k);
  const double units = W * T * reach, remote_units = (W - 1) * T * reach;
  LayerWork w = row_work(s, p, layer, dtype);
  w.link_bytes = remote_units * w.row_bytes;
  w.comm_units = w.layer == 0 ? remote_units : units;
  w.rows_per_unit = units > 0 ? rows / units : 1;
  w.flops *= rows;  // row_work's flops are one row's
  (void)tile_n;
  return w;
}

}  // namespace comet
