#include "table_from_results.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "tune_records.hpp"

namespace comet::tune_tool {

using nlohmann::json;

namespace {

// A key's pick and its measured (or, scaled by GEMM runs, estimated) time.
struct Best {
  TuneKey key;
  LayerVariant v;
  double ms = 1e30;
};
// One point of a key's sweep: the tile width, the comm blocks and layer 0's wave chunk (1: the default
// order; a skewed sweep's entries may pick another, comet/plan.hpp: WaveChunkRule).
struct PointId {
  int tile_n = 256, n_comm = 0, wave_chunk = 1;
  bool operator<(const PointId& o) const {
    return std::tie(tile_n, n_comm, wave_chunk) < std::tie(o.tile_n, o.n_comm, o.wave_chunk);
  }
};
using Points = std::map<PointId, Best>;  // one key's sweep: point -> time

// The sequential mode runs its GEMM alone, so its width is the one whose GEMM-alone runs are the fastest
// against cuBLAS (gemm_width_runs.hpp), under kMeasuredGain. Its time at that width: the sweep's fastest
// sequential-mode point at a width the runs measured, scaled by the two widths' ratios. It replaces a
// sequential-mode pick of another width, and a fused pick it beats by kMeasuredGain (a fused split at
// another width is not predicted).
void apply_width(const std::string& s, Best& b, const Points& sweep, const WidthRatios& widths) {
  const auto it = widths.find(s);
  if (it == widths.end()) return;
  const auto pick = width_pick(it->second, kMeasuredGain);
  const Best* seq = nullptr;
  for (const auto& [pt, p] : sweep)
    if (pt.n_comm == 0 && pt.wave_chunk == 1 && it->second.count(pt.tile_n) && (!seq || p.ms < seq->ms)) seq = &p;
  if (!pick || !seq) return;
  const double ms = seq->ms * it->second.at(*pick) / it->second.at(seq->v.tile_n);
  if (b.v.n_comm == 0 ? *pick == b.v.tile_n : ms >= kMeasuredGain * b.ms) return;
  std::printf("  %-78s n_comm %d tile %d %.3f ms -> n_comm 0 tile %d %.3f ms (GEMM alone / cuBLAS %.3f -> %.3f)\n",
              s.c_str(), b.v.n_comm, b.v.tile_n, b.ms, *pick, ms, it->second.at(seq->v.tile_n),
              it->second.at(*pick));
  b.v.tile_n = *pick, b.v.n_comm = 0, b.ms = ms;
}

// The standalone GEMM of one run with the shortest time (ours among them).
std::map<StandaloneGemm, double>::const_iterator fastest_gemm(const std::map<StandaloneGemm, double>& times) {
  return std::min_element(times.begin(), times.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
}

// A fused pick gives way to the sequential schedule with a standalone GEMM of CUTLASS's when that is
// faster by kMeasuredGain: the sweep's sequential point at a width the standalone runs timed, with our
// GEMM's time there swapped for the fastest one's. (The sweep's sequential points run our GEMM, so a
// narrow N whose 128 x 160 GEMM leads ours by more than the comm blocks save stayed fused: Phi-3.5 TP 8's
// launch 2, N = 800, at 16384 tokens.)
void prefer_sequential_standalone(const std::string& s, Best& b, const Points& sweep, const StandaloneRuns& runs) {
  std::optional<Best> alt;
  for (const auto& [tile, times] : runs) {
    const auto seq = sweep.find(PointId{tile, 0, 1});
    const auto ours = times.find(StandaloneGemm::comet);
    if (seq == sweep.end() || ours == times.end()) continue;
    const auto fastest = fastest_gemm(times);
    const double ms = seq->second.ms - ours->second + fastest->second;
    if (ms < (alt ? alt->ms : kMeasuredGain * b.ms)) {
      alt = seq->second;
      alt->v.standalone_gemm = fastest->first;
      alt->ms = ms;
    }
  }
  if (!alt) return;
  std::printf("  %-78s n_comm %d tile %d %.3f ms -> n_comm 0 tile %d gemm %s %.3f ms (the sequential point with "
              "that GEMM)\n",
              s.c_str(), b.v.n_comm, b.v.tile_n, b.ms, alt->v.tile_n, to_string(alt->v.standalone_gemm), alt->ms);
  b = *alt;
}

// Where the sequential schedule is the pick, its GEMM is the fastest standalone one measured for the key
// when that beats ours by kMeasuredGain. Ours at the pick's width: from the runs at that width, else from a
// run at another width scaled by the GEMM runs' ratios (--gemm-runs), else no comparison. Where a fused
// split is the pick and `sweep` has its key's points: prefer_sequential_standalone.
void apply_standalone(const std::string& s, Best& b, const std::map<std::string, StandaloneRuns>& standalone,
                      const WidthRatios& widths, const Points* sweep = nullptr) {
  const auto it = standalone.find(s);
  if (it == standalone.end()) return;
  if (b.v.n_comm != 0) {
    if (sweep) prefer_sequential_standalone(s, b, *sweep, it->second);
    return;
  }
  const auto w = widths.find(s);
  const std::map<StandaloneGemm, double>* run = nullptr;
  double scale = 1;
  for (const auto& [tile, times] : it->second) {
    if (!times.count(StandaloneGemm::comet)) continue;
    if (tile == b.v.tile_n) {
      run = &times, scale = 1;
      break;
    }
    if (w != widths.end() && w->second.count(tile) && w->second.count(b.v.tile_n))
      run = &times, scale = w->second.at(b.v.tile_n) / w->second.at(tile);
  }
  if (!run) return;
  const double ours = run->at(StandaloneGemm::comet) * scale;
  const auto fastest = fastest_gemm(*run);
  const double gain = fastest->first == StandaloneGemm::cublas ? kCublasGain : kMeasuredGain;
  b.v.standalone_gemm = fastest->first != StandaloneGemm::comet && fastest->second < gain * ours
                            ? fastest->first
                            : StandaloneGemm::comet;
}

// Fits the comm blocks' unit costs to comm-only runs (at whatever n_comm they ran; the link's ceiling,
// set before, is part of the prediction): least squares of log(predicted / measured) over a grid of
// the three constants.
void fit_comm(const std::vector<json>& runs, CostModel& c) {
  if (runs.empty()) return;
  double best = 1e300;
  CostModel fit = c;
  // Log-spaced grids: over the device link a block's costs are several times smaller than over PCIe.
  auto grid = [](double lo, double hi, int steps) {
    std::vector<double> v;
    for (int i = 0; i <= steps; ++i) v.push_back(lo * std::pow(hi / lo, double(i) / steps));
    return v;
  };
  for (double u0 : grid(0.05, 2.0, 32))
    for (double st : grid(25.0, 800.0, 10))
      for (double s1 : grid(0.02, 2.0, 40)) {
        CostModel t = c;
        t.l0_unit_us = u0, t.l0_store_gbps = st, t.l1_slice_us = s1, t.overlap_penalty = 0;
        double err = 0;
        for (const json& r : runs) {
          LayerWork w = work_of(r);
          w.flops = 0;
          const double e = std::log(t.predict_ms(w, r.value("n_comm", 2), 132) / r.value("median_ms", 1.0));
          err += e * e;
        }
        if (err < best) best = err, fit = t;
      }
  c.l0_unit_us = fit.l0_unit_us, c.l0_store_gbps = fit.l0_store_gbps, c.l1_slice_us = fit.l1_slice_us;
}

}  // namespace

// A gemm_<name> record into `runs` (its key's, uniform routing); false for other records.
bool add_standalone(const json& r, int sms, std::map<std::string, StandaloneRuns>& runs,
                    std::map<std::string, TuneKey>* keys) {
  const std::string mode = r.value("mode", "");
  if (r.value("system", "") != "comet" || mode.rfind("gemm_", 0) != 0 || mode == "gemm_only") return false;
  const auto g = standalone_gemm_named(mode.substr(5));
  if (!g || launch_of(r) < 0) return false;
  const TuneKey k = uniform_key_of(r, sms);
  runs[k.str()][r.value("tile_n", 256)][*g] = r.value("median_ms", 1e30);
  if (keys) keys->emplace(k.str(), k);
  return true;
}

// --gemm-runs / --standalone-runs without --from-results: the table's own sequential-mode entries take the
// width and the standalone GEMM those runs favour (the rules above, with the entry as the sweep's one
// point). Fused entries stay (no sequential-mode time to scale), as do keys the runs do not cover and
// one-launch entries (their GEMM and combine in one launch measured faster than two launches, which
// another GEMM would be). A GEMM alone does not depend on the link: a run's key refines the entry of the
// same key on the other link too.
void refine_entries(const std::map<std::string, TuneKey>& keys,
                    const std::map<std::string, StandaloneRuns>& standalone, const WidthRatios& widths,
                    TuneTable& table) {
  for (const auto& [s, run_key] : keys)
    for (Link link : {run_key.link, run_key.link == Link::host ? Link::device : Link::host}) {
      TuneKey k = run_key;
      k.link = link;
      const TuneEntry* e = table.find(k);
      if (!e || e->variant.n_comm != 0 || e->variant.one_launch) continue;
      Best b{k, e->variant, e->ms};
      // The runs are filed under the run's key (the link it ran on).
      apply_width(s, b, Points{{PointId{b.v.tile_n, 0, 1}, b}}, widths);
      apply_standalone(s, b, standalone, widths);
      if (b.v.tile_n == e->variant.tile_n && b.v.standalone_gemm == e->variant.standalone_gemm) continue;
      if (b.v.standalone_gemm != e->variant.standalone_gemm)  // apply_width printed a width change
        std::printf("  %-78s gemm %s -> %s\n", k.str().c_str(), to_string(e->variant.standalone_gemm),
                    to_string(b.v.standalone_gemm));
      table.put(k, TuneEntry{b.v, b.ms});
    }
}

// Best fused variant per key and the calibrated cost model per (gpu, link), from benchmark records.
void fill_from_results(const std::vector<json>& records, const FromResults& a, const WidthRatios& widths,
                       TuneTable& table) {
  std::map<std::string, Best> best;
  std::map<std::string, Points> points;
  std::map<std::string, std::vector<double>> gemm_rate, fp8_rate, link;  // by gpu|link
  std::map<std::string, std::vector<json>> comm_runs;
  std::map<std::string, StandaloneRuns> standalone;
  // Layer-0 gemm_only runs by gpu|link, then case, then tile_n.
  std::map<std::string, std::map<std::string, std::map<int, json>>> gemm_by_tile;
  // A fused record's time at its (tile, n_comm, wave chunk) under key k; a later record replaces an
  // earlier one. The chunk orders layer 0's tiles only (other launches' records run the same order).
  auto add_point = [&](const TuneKey& k, const json& r) {
    const int tn = r.value("tile_n", 256), nc = r.value("n_comm", 1);
    const int chunk = launch_of(r) == 0 ? std::max(1, r.value("wave_chunk", 1)) : 1;
    LayerVariant v{tn, nc, 0, 1};
    v.wave_chunk = chunk > 1 ? chunk : 0;
    points[k.str()][PointId{tn, nc, chunk}] = Best{k, v, r.value("median_ms", 1e30)};
  };
  for (const json& r : records) {
    if (r.value("system", "") != "comet") continue;
    // A fused layer 0 in m order (comet-bench --tile-order m) is not what an entry runs, nor, under uniform
    // routing, one in wave chunks (the host's own picks, load class 1, keep the default order). Nor is a
    // layer whose pull order was forced (comet-bench --pull-order): no entry carries a pull order.
    if (r.contains("tile_order") || r.contains("pull_order")) continue;
    if (r.value("wave_chunk", 1) > 1 && r.value("routing", "") == "uniform" && launch_of(r) == 0) continue;
    const std::string layer = r.value("layer", "");
    if (launch_of(r) < 0) continue;
    if (!of_transport(r, a.transport)) continue;
    const std::string gpu = r.value("gpu", "?"), lk = to_string(link_of(r));
    if (r.value("routing", "") != "uniform") {
      // A skewed sweep gives the entries of its load class (> 1: what the device looks up); class 1
      // and the calibration (which assumes uniform routing) stay with the uniform sweeps.
      if (r.value("mode", "") != "fused" || r.value("tuned", false)) continue;
      const TuneKey k = key_of(r, sms_of(r, a.sms));
      if (k.load > 1) add_point(k, r);
      continue;
    }
    const std::string mode = r.value("mode", "");
    const int sms = sms_of(r, a.sms);
    if (mode.rfind("gemm_", 0) == 0 && mode != "gemm_only") {
      add_standalone(r, sms, standalone);
      continue;
    }
    const std::string model_key = gpu + '|' + lk;
    const int tile_n = r.value("tile_n", 256);
    // --tile-runs records are all of this kind; the tile shapes' rates are bf16's (e4m3 has one tile).
    if (mode == "gemm_only" && layer == "l0" && r.value("dtype", "bf16") == "bf16")
      gemm_by_tile[model_key][r.value("model", "") + '|' + r.value("layout", "") + '|' +
                              std::to_string(r.value("tokens_per_rank", 0))][tile_n] = r;
    if (r.value("tile_run_only", false)) continue;  // --tile-runs: the tile-shape fit only
    // The cost model is calibrated on the forward's layers (the backward's launches get table entries
    // from their sweeps, and the model's rates where they have none), and on bf16 runs, except for its
    // fp8 GEMM rate, which layer 0's e4m3 gemm_only runs give (e4m3 sweeps also give table entries).
    const bool calibrates = launch_of(r) < 2 && r.value("dtype", "bf16") == "bf16";
    if (layer == "l0" && r.value("dtype", "bf16") == "e4m3" && mode == "gemm_only" && r.contains("tflops") &&
        r["tflops"].is_number())
      fp8_rate[model_key].push_back(r["tflops"].get<double>() / sms);
    if (calibrates && mode == "gemm_only" && tile_n == 256 && r.contains("tflops") && r["tflops"].is_number())
      gemm_rate[model_key].push_back(r["tflops"].get<double>() / sms);
    if (calibrates && mode == "comm_only" && r.contains("gb_s") && r["gb_s"].is_number()) {
      link[model_key].push_back(r["gb_s"].get<double>());
      comm_runs[model_key].push_back(r);
    }
    if (mode != "fused" || r.value("tuned", false)) continue;
    const TuneKey k = uniform_key_of(r, sms);
    add_point(k, r);
  }
  // Each key's fastest measured point; a point (tile, n_comm) measured again in a later record (a
  // later file on the command line: a newer sweep) replaces the earlier measurement.
  for (const auto& [s, by_point] : points)
    for (const auto& [pt, p] : by_point)
      if (p.ms < best[s].ms) best[s] = p;
  // A tile other than 256 (a narrower one, or layer 0's 320) replaces the 256-wide one only when it beats
  // its best point by kMeasuredGain.
  for (auto& [s, b] : best) {
    if (b.v.tile_n == 256) continue;
    const Best* wide = nullptr;
    for (const auto& [pt, p] : points[s])
      if (pt.tile_n == 256 && (!wide || p.ms < wide->ms)) wide = &p;
    if (wide && b.ms >= kMeasuredGain * wide->ms) b = *wide;
  }
  // Likewise a wave chunk other than the default replaces the default order's best point only when it
  // beats it by kMeasuredGain (the chunked runs' time moved erratically with n_comm: docs/design-changes.md,
  // "Layer 0's tile order under skew").
  for (auto& [s, b] : best) {
    if (b.v.wave_chunk == 0) continue;
    const Best* plain = nullptr;
    for (const auto& [pt, p] : points[s])
      if (pt.wave_chunk == 1 && pt.tile_n == b.v.tile_n && (!plain || p.ms < plain->ms)) plain = &p;
    if (plain && b.ms >= kMeasuredGain * plain->ms) b = *plain;
  }
  for (auto& [s, b] : best) apply_width(s, b, points[s], widths);
  // 128x128 and 128x192 tiles' rates against 128x256 at equal padding, from cases measured with both.
  std::map<std::string, std::map<int, std::vector<double>>> tile_eff;  // gpu|link -> tile_n -> ratios
  for (const auto& [mk, cases] : gemm_by_tile)
    for (const auto& [id, by_tile] : cases)
      for (int t : {128, 192}) {
        if (!by_tile.count(t) || !by_tile.count(256)) continue;
        const json& rt = by_tile.at(t);
        const int n = work_of(rt).gemm_n;
        const double pad = double((n + t - 1) / t * t) / double((n + 255) / 256 * 256);
        tile_eff[mk][t].push_back(by_tile.at(256).value("median_ms", 0.0) / rt.value("median_ms", 1.0) * pad);
      }
  for (auto& [s, b] : best) apply_standalone(s, b, standalone, widths, &points[s]);
  for (const auto& [s, b] : best) {
    table.put(b.key, TuneEntry{b.v, b.ms});
    const bool ours = b.v.standalone_gemm == StandaloneGemm::comet;
    std::printf("  %-78s n_comm %2d  tile %d  %.3f ms%s%s%s\n", s.c_str(), b.v.n_comm, b.v.tile_n, b.ms,
                ours ? "" : "  gemm ", ours ? "" : to_string(b.v.standalone_gemm),
                b.v.wave_chunk > 0 ? ("  wave_chunk " + std::to_string(b.v.wave_chunk)).c_str() : "");
  }
  if (a.entries_only) return;
  for (const auto& [mk, rates] : gemm_rate) {
    const std::string gpu = mk.substr(0, mk.rfind('|'));
    const Link lk = parse_link(mk.substr(mk.rfind('|') + 1));
    CostModel c = CostModel::defaults(lk);
    c.gemm_tflops_per_sm = median(rates);
    if (!fp8_rate[mk].empty()) c.fp8_gemm_tflops_per_sm = median(fp8_rate[mk]);
    if (!link[mk].empty()) c.link_gbps = *std::max_element(link[mk].begin(), link[mk].end());
    fit_comm(comm_runs[mk], c);
    std::vector<double>&e128 = tile_eff[mk][128], &e192 = tile_eff[mk][192];
    if (!e128.empty()) c.tile128_efficiency = median(e128);
    if (!e192.empty()) c.tile192_efficiency = median(e192);
    table.set_model(gpu, lk, c);
    std::printf("  cost model %s: GEMM %.2f TFLOP/s per SM (e4m3 %.2f, %zu runs); comm block: layer 0 %.2f us "
                "per unit + stores at %.0f GB/s, layer 1 %.3f us per slice batch; link %.1f GB/s; 128x128 tiles at "
                "%.2f of the rate (%zu cases), 128x192 at %.2f (%zu)\n",
                mk.c_str(), c.gemm_tflops_per_sm, c.fp8_gemm_tflops_per_sm, fp8_rate[mk].size(), c.l0_unit_us,
                c.l0_store_gbps, c.l1_slice_us, c.link_gbps, c.tile128_efficiency, e128.size(), c.tile192_efficiency,
                e192.size());
  }
}

}  // namespace comet::tune_tool
