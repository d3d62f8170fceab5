// The cost model's arithmetic (tune.hpp has the formulas and where the constants come from), written
// once for the host and the device: the host picks a variant from the expected work of a key, and the
// fused kernels may re-pick n_comm from the work the plan actually holds (adaptive split).
#pragma once

#include <math.h>

#include "comet/hd.hpp"
#include "comet/tune.hpp"

namespace comet {

namespace cost_model_detail {
COMET_HD inline double max_d(double a, double b) { return a > b ? a : b; }
COMET_HD inline double min_d(double a, double b) { return a < b ? a : b; }
}  // namespace cost_model_detail

// Bytes of one moved row (LayerWork::row_bytes; 0 means a bf16 row of H).
COMET_HD inline double cost_row_bytes(const LayerWork& w) { return w.row_bytes > 0 ? w.row_bytes : w.hidden * 2.0; }

COMET_HD inline double cost_unit_us(const CostModel& m, const LayerWork& w) {
  if (w.layer == 0) return m.l0_unit_us + w.rows_per_unit * cost_row_bytes(w) / (m.l0_store_gbps * 1e3);
  return m.l1_slice_us * ::ceil(w.hidden / 256.0) * w.topk / 16.0;
}

// The columns a GEMM of n columns computes in tile_n-wide column blocks (the last one padded).
COMET_HD inline int padded_columns(int n, int tile_n) { return (n + tile_n - 1) / tile_n * tile_n; }

// T_gemm of a tile shape against 128x256 tiles at the layer's rate. The fp8 rate is the 128-wide tile's
// own (the one fp8 tile), so an fp8 layer's factor is 1. Layer 0's 320-wide tile (table picks only:
// best_tile_n never offers it) is taken at the 256-wide tile's rate.
COMET_HD inline double cost_tile_factor(const CostModel& m, const LayerWork& w, int tile_n) {
  if (tile_n == 256 || w.gemm_n <= 0 || w.fp8) return 1.0;
  const double efficiency = tile_n == 192 ? m.tile192_efficiency : tile_n == 128 ? m.tile128_efficiency : 1.0;
  return double(padded_columns(w.gemm_n, tile_n)) / padded_columns(w.gemm_n, 256) / efficiency;
}

// Predicted time (ms) of the layer with n_comm comm blocks out of `sms` (0: sequential mode).
COMET_HD inline double cost_predict_ms(const CostModel& m, const LayerWork& w, int n_comm, int sms, int tile_n) {
  using namespace cost_model_detail;
  // Sequential mode (n_comm 0): the communication on every SM, then the GEMM on every SM.
  const int gemm_sms = n_comm == 0 ? sms : (sms - n_comm > 1 ? sms - n_comm : 1);
  const double rate = w.fp8 ? m.fp8_gemm_tflops_per_sm : m.gemm_tflops_per_sm;
  const double t_gemm = w.flops * cost_tile_factor(m, w, tile_n) / (rate * 1e12 * gemm_sms) * 1e3;
  double t_comm = 0;
  if (w.comm_units > 0) {
    const double t_blocks = w.comm_units * cost_unit_us(m, w) / (n_comm == 0 ? sms : n_comm) * 1e-3;
    const double t_link = w.link_bytes / (m.link_gbps * 1e9) * 1e3;
    // The 4-norm of the two limits (a soft max), with square roots rather than pow: pow is a call in
    // device code, and a call keeps ptxas from keeping the fused kernels' wgmma pipelined when they
    // are compiled as relocatable code (the NVSHMEM transport's build).
    const double b2 = t_blocks * t_blocks, l2 = t_link * t_link;
    t_comm = ::sqrt(::sqrt(b2 * b2 + l2 * l2));
  }
  if (n_comm == 0) return t_gemm + t_comm;
  return max_d(t_gemm, t_comm) + m.overlap_penalty * min_d(t_gemm, t_comm);
}

// The candidate n_comm (2, 4, 8, 16, 24, 32, at most 40 % of sms) with the least predicted time, the
// fewest blocks among those within 1 % of it; with allow_sequential, 0 if that is predicted
// sequential_margin faster still.
COMET_HD inline int cost_best_n_comm(const CostModel& m, const LayerWork& w, int sms, int tile_n,
                                     bool allow_sequential) {
  constexpr int kCandidates[] = {2, 4, 8, 16, 24, 32};
  const int cap = sms * 2 / 5 > 2 ? sms * 2 / 5 : 2;
  double best_ms = 1e300;
  for (int n : kCandidates)
    if (n <= cap) best_ms = cost_model_detail::min_d(best_ms, cost_predict_ms(m, w, n, sms, tile_n));
  if (allow_sequential && w.comm_units > 0 &&
      cost_predict_ms(m, w, 0, sms, tile_n) < best_ms * (1.0 - m.sequential_margin))
    return 0;
  for (int n : kCandidates)
    if (n <= cap && cost_predict_ms(m, w, n, sms, tile_n) <= best_ms * 1.01) return n;
  return kCandidates[0];
}

// Load class of a rank's batch: its rows against the uniform expectation, rounded to a power of two and
// held to 1..8 (a rank lighter than uniform is class 1). Under skewed routing the hot rank sets the
// layer's time; its class (Zipf 1.2 over the experts: 2-8) keys table entries measured under that
// skew, which the fused kernels look up from the plan's counts (adaptive split).
COMET_HD inline int load_class(double rows, double expected_rows) {
  if (!(expected_rows > 0) || rows < 1.41421356 * expected_rows) return 1;
  if (rows < 2.82842712 * expected_rows) return 2;
  if (rows < 5.65685425 * expected_rows) return 4;
  return 8;
}
COMET_HD inline int load_class_index(int load) { return load >= 8 ? 3 : load >= 4 ? 2 : load >= 2 ? 1 : 0; }

// A rank's work as its plan counts it: `per_row` holds the layer's shape fields (layer, hidden, topk,
// gemm_n, row_bytes, fp8) and the GEMM flops of ONE row in `flops`; rows, units and local units come
// from the plan.
COMET_HD inline LayerWork measured_work(const LayerWork& per_row, double rows, double units, double local_units) {
  LayerWork w = per_row;
  const double remote = units - local_units;
  w.flops = per_row.flops * rows;
  w.link_bytes = remote * cost_row_bytes(per_row);
  w.comm_units = per_row.layer == 0 ? remote : units;
  w.rows_per_unit = units > 0 ? rows / units : 1.0;
  return w;
}

}  // namespace comet
