// The cost model (tune.hpp has its formulas and where its constants come from).
#include "tune/cost_model_eval.hpp"
#include "comet/tune.hpp"

namespace comet {

CostModel CostModel::defaults(Link link) {
  CostModel m;
  if (link == Link::device) m.link_gbps = 1000.0;  // HBM to HBM: the blocks' own rate is the limit
  return m;
}

double CostModel::unit_us(const LayerWork& w) const { return cost_unit_us(*this, w); }

double CostModel::tile_factor(const LayerWork& w, int tile_n) const { return cost_tile_factor(*this, w, tile_n); }

int CostModel::best_tile_n(const LayerWork& w) const {
  int best = 256;  // among equals the widest tile
  for (int t : {192, 128}) {
    if (t == 192 && (w.layer != 0 || w.backward)) continue;  // layer 1's: measured picks only (tune.hpp)
    if (tile_factor(w, t) < tile_factor(w, best)) best = t;
  }
  return tile_factor(w, best) < kNarrowTileGain * tile_factor(w, 256) ? best : 256;
}

double CostModel::predict_ms(const LayerWork& w, int n_comm, int sms, int tile_n) const {
  return cost_predict_ms(*this, w, n_comm, sms, tile_n);
}

int CostModel::best_n_comm(const LayerWork& w, int sms, int tile_n) const {
  return cost_best_n_comm(*this, w, sms, tile_n, true);
}

}  // namespace comet
