// comet-tune: fills the tuner's table (TuneTable::user_path(), or --table) for model configs.
//
//   comet-tune --model mixtral --layout ep8 --link host --tokens 1024,4096 [--n-comm 0,1,2,4,8,16,24,32]
//              [--routings uniform,zipf1.2]
//       measures on this GPU: runs the benchmark's comet sweep in-process (fused at every n_comm, 0 being the
//       sequential mode; comm-only at every n_comm; gemm-only) for the config, then records the best
//       variant per (launch, tokens bucket) and calibrates the cost model (GEMM rate per SM, per-block
//       comm rates, link ceiling); skewed batches (--routings, default uniform,zipf1.2) give the
//       entries of their load class (TuneKey::load), which the fused kernels look up from the plan
//       (MoeOptions::adaptive_split, on by default). --layers l0,l1,l2,l3 (the default) also sweeps the
//       backward's two fused launches (2: backward of layer 1, 3: of layer 0), which get keys of their own
//   comet-tune --from-results a.json [b.json ...] [--tile-runs c.json ...] [--transport cuda_ipc]
//       the same from benchmark results already measured (any machine): comet-bench's, or comet-bench-ipc's
//       on your own GPUs (one process per rank, the real link: its "nvlink" records key the device link
//       an IpcTeam has; --transport picks which of its transports' rows count, default cuda_ipc, the
//       peer-pointer kernels a layer runs by default); --tile-runs files only feed
//       the tile shapes' relative GEMM rates (their layer-0 gemm-only runs), not the picks or comm costs;
//       --entries-only keeps the table's cost models (a partial sweep updates its keys' picks only);
//       --gemm-runs files (paired GEMM-alone runs with cuBLAS, one per tile width) set the tile width of
//       the sequential-mode picks (gemm_width_runs.hpp); --standalone-runs files give only their
//       standalone-GEMM records (comet-bench --standalone-gemms: modes gemm_<name>), so that a one-GPU run
//       can add CUTLASS's grouped GEMMs to picks swept elsewhere (its other records would replace points
//       of those sweeps)
//   comet-tune --gemm-runs JSON... / --standalone-runs JSON... (without --from-results)
//       refines the table's own sequential-mode entries with those runs: width and standalone GEMM
//   comet-tune --evaluate a.json [...] [--table PATH] [--measured-work] [--sequential-margin X]
//       for every case of those results, the variant the tuner picks (table, else cost model) against
//       the best of the case's measured n_comm sweep (picks among the swept values are exact; others
//       are reported as unmeasured; a skewed case takes its load class's entry when the table has one,
//       as the adaptive split does); --measured-work gives the cost model the rows each record counted
//       instead of the uniform expectation (what a pick made on the device, from the plan, would see)
//   comet-tune --what-if-link 450 [--latency-scale 2] [--tokens LIST] [--table PATH]
//       the cost model's picks and predicted fused / sequential times for the benchmark's cases at a
//       link we cannot measure on one GPU (link_what_if.hpp)
//   comet-tune --where
//       which tables a FusedMoe loads by default (the shipped one, then the user's over it)
//   comet-tune --lookup-overhead
//       how long a pick takes (table hit, cost model), on the host
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tune/cost_model_eval.hpp"
#include "comet/tune.hpp"
#include "comet_bench.hpp"
#include "gemm_width_runs.hpp"
#include "link_what_if.hpp"
#include "models.hpp"

using namespace comet;
using nlohmann::json;

namespace {

struct Args {
  std::string table = TuneTable::user_path();
  std::vector<std::string> results;
  std::vector<std::string> evaluate;
  std::vector<std::string> tile_runs;  // --from-results files used only for the tile shapes' GEMM rates
  std::vector<std::string> gemm_runs;  // --from-results: paired GEMM-alone runs, the n_comm-0 picks' widths
  std::vector<std::string> standalone_runs;  // --from-results: files whose gemm_<name> records alone count
  bool entries_only = false;           // --from-results: the picks only, no cost-model refit
  std::string model, layout = "ep8", link = "host", tokens = "1024,4096", n_comm = "0,1,2,4,8,16,24,32";
  // Measuring: the uniform sweep fills the keys (load class 1) and calibrates the cost model; the Zipf
  // sweep fills the entries of the hot rank's load class (none under TP, whose ranks all get every row).
  std::string routings = "uniform,zipf1.2";
  std::string layers = "l0,l1,l2,l3";  // the launches swept: the forward's layers and the backward's
  int sms = 0;  // 0: from the records ("sms"; 132 where they have none)
  std::string transport = "cuda_ipc";  // --from-results: comet-bench-ipc records of this transport only
  bool lookup_overhead = false;
  bool measured_work = false;  // --evaluate: the cost model sees each record's measured rows
  bool dump_work = false;      // --evaluate: also print each case's measured work and sweep as JSON
  double what_if_gbps = 0;      // --what-if-link
  double latency_scale = 1.0;   // --latency-scale
  std::optional<double> sequential_margin;  // --sequential-margin: overrides the cost models' (H200, both links)
};

// What the evaluation asks the tuner: the tile the sweeps measured, the rest its choice.
LayerRequest tile256() {
  LayerRequest r;
  r.tile_n = 256;
  return r;
}

// Which tables a FusedMoe loads by default, and what each holds.
void where() {
  const std::string shipped = TuneTable::shipped_path(), user = TuneTable::user_path();
  std::printf("shipped table: %s (%zu entries%s)\n", shipped.c_str(), TuneTable::load(shipped).size(),
              std::filesystem::exists(shipped) ? "" : ", missing");
  std::printf("user table:    %s (%zu entries%s; overrides the shipped one key by key)\n", user.c_str(),
              TuneTable::load(user).size(), std::filesystem::exists(user) ? "" : ", missing");
  std::printf("in use:        %zu entries\n", TuneTable::load_default().size());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A record's SM count: --sms, else the one the benchmark wrote ("sms"), else 132 (H100 SXM, H200:
// records written before the benchmark kept the count).
int sms_of(const json& r, int forced) {
  if (forced > 0) return forced;
  return r.contains("sms") && r["sms"].is_number_integer() ? r["sms"].get<int>() : 132;
}

// The link a record's key has: the team's. comet-bench-ipc with one GPU per rank writes "nvlink" (its
// IpcTeam's buffers are device memory, so the layer keys them as the device link), on one GPU "device".
Link link_of(const json& r) {
  const std::string l = r.value("link", "host");
  return l == "nvlink" ? Link::device : parse_link(l);
}

// Whether a record counts for the table: comet-bench-ipc's records name the way the ranks reached each
// other, and the table has one row per key for the kernels --transport names; comet-bench's records
// name none and always count.
bool of_transport(const json& r, const Args& a) {
  return !r.contains("transport") || r.value("transport", "") == a.transport;
}

// A record's launch id (comet/tune.hpp: "l0".."l3"), -1 for the whole-layer records (fwd, bwd, ...).
int launch_of(const json& r) {
  const std::string l = r.value("layer", "");
  return l.size() == 2 && l[0] == 'l' && l[1] >= '0' && l[1] < char('0' + kLaunchLayers) ? l[1] - '0' : -1;
}

TuneKey key_of(const json& r, int sms) {
  const bench::Model& m = bench::find_model(r.value("model", ""));
  TuneKey k;
  k.gpu = r.value("gpu", "?");
  k.sms = sms;
  k.layer = launch_of(r);
  k.hidden = m.shape.hidden;
  k.ffn = m.shape.ffn;
  k.experts = m.shape.num_experts;
  k.topk = m.shape.topk;
  k.world = r.value("world", 8);
  k.ep = r.value("ep", 8);
  k.tp = r.value("tp", 1);
  k.link = link_of(r);
  k.tokens_bucket = tokens_bucket(r.value("tokens_per_rank", 0));
  // Layer 0's inputs (comet-bench --dtype): e4m3 entries are keys of their own; layer 1 is bf16 either way.
  if (k.layer == 0) k.dtype = r.value("dtype", "bf16");
  // The load class of the rows rank 0 counted (records without them: uniform).
  const int tokens = r.value("tokens_per_rank", 0);
  if (r.contains("rows") && r["rows"].is_number() && tokens > 0)
    k.load = load_class(r["rows"].get<double>(), expected_rows(m.shape, Parallel{k.ep, k.tp}, tokens));
  return k;
}

// The work the cost model sees for a record: expected from the key (uniform routing), or, with
// `measured`, from the rows and link rows the record counted on rank 0 (what a pick made on the device
// from the plan would see; local units taken as an even 1/(W-1) of the remote ones).
LayerWork work_of(const json& r, bool measured = false) {
  const bench::Model& m = bench::find_model(r.value("model", ""));
  const Parallel par{r.value("ep", 8), r.value("tp", 1)};
  const DType dtype = r.value("dtype", "bf16") == "e4m3" ? DType::e4m3 : DType::bf16;
  LayerWork w = expected_work(m.shape, par, launch_of(r), r.value("tokens_per_rank", 0), 256, dtype);
  if (measured && r.contains("rows") && r.contains("link_rows")) {
    const double remote = r.value("link_rows", 0), W = par.world();
    const double units = remote * W / std::max(1.0, W - 1);
    w = measured_work(row_work(m.shape, par, launch_of(r), dtype), r.value("rows", 0), units, units - remote);
  }
  return w;
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

// A key's pick and its measured (or, scaled by GEMM runs, estimated) time.
struct Best {
  TuneKey key;
  LayerVariant v;
  double ms = 1e30;
};
using Points = std::map<std::pair<int, int>, Best>;  // one key's sweep: (tile_n, n_comm) -> time
// One key's standalone-GEMM runs (comet-bench --standalone-gemms: modes gemm_<name>), by the width ours ran at.
using StandaloneRuns = std::map<int, std::map<StandaloneGemm, double>>;

// A narrower tile than 256, or a standalone GEMM, replaces ours only when it beats it by 3 %: closer is
// noise (Mixtral EP 4 x TP 2 layer 1 at 4096 tokens "won" at 192 by 0.01 % in run 37's sweep and then ran
// 15 % slower in the validation; the sequential point was timed with our GEMM).
constexpr double kMeasuredGain = 0.97;

// A gemm_<name> record into `runs` (its key's, uniform routing); false for other records.
bool add_standalone(const json& r, int sms, std::map<std::string, StandaloneRuns>& runs,
                    std::map<std::string, TuneKey>* keys = nullptr) {
  const std::string mode = r.value("mode", "");
  if (r.value("system", "") != "comet" || mode.rfind("gemm_", 0) != 0 || mode == "gemm_only") return false;
  const auto g = standalone_gemm_named(mode.substr(5));
  if (!g || launch_of(r) < 0) return false;
  TuneKey k = key_of(r, sms);
  k.load = 1;
  runs[k.str()][r.value("tile_n", 256)][*g] = r.value("median_ms", 1e30);
  if (keys) keys->emplace(k.str(), k);
  return true;
}

// The sequential mode runs its GEMM alone, so its width is the one whose GEMM-alone runs are the fastest
// against cuBLAS (gemm_width_runs.hpp), under kMeasuredGain. Its time at that width: the sweep's fastest
// sequential-mode point at a width the runs measured, scaled by the two widths' ratios. It replaces a
// sequential-mode pick of another width, and a fused pick it beats by kMeasuredGain (a fused split at
// another width is not predicted).
void apply_width(const std::string& s, Best& b, const Points& sweep, const tune_tool::WidthRatios& widths) {
  const auto it = widths.find(s);
  if (it == widths.end()) return;
  const auto pick = tune_tool::width_pick(it->second, kMeasuredGain);
  const Best* seq = nullptr;
  for (const auto& [pt, p] : sweep)
    if (pt.second == 0 && it->second.count(pt.first) && (!seq || p.ms < seq->ms)) seq = &p;
  if (!pick || !seq) return;
  const double ms = seq->ms * it->second.at(*pick) / it->second.at(seq->v.tile_n);
  if (b.v.n_comm == 0 ? *pick == b.v.tile_n : ms >= kMeasuredGain * b.ms) return;
  std::printf("  %-78s n_comm %d tile %d %.3f ms -> n_comm 0 tile %d %.3f ms (GEMM alone / cuBLAS %.3f -> %.3f)\n",
              s.c_str(), b.v.n_comm, b.v.tile_n, b.ms, *pick, ms, it->second.at(seq->v.tile_n),
              it->second.at(*pick));
  b.v.tile_n = *pick, b.v.n_comm = 0, b.ms = ms;
}

// Where the sequential schedule is the pick, its GEMM is the fastest standalone one measured for the key
// when that beats ours by kMeasuredGain. Ours at the pick's width: from the runs at that width, else from a
// run at another width scaled by the GEMM runs' ratios (--gemm-runs), else no comparison.
void apply_standalone(const std::string& s, Best& b, const std::map<std::string, StandaloneRuns>& standalone,
                      const tune_tool::WidthRatios& widths) {
  const auto it = standalone.find(s);
  if (b.v.n_comm != 0 || it == standalone.end()) return;
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
  const auto fastest = std::min_element(run->begin(), run->end(),
                                        [](const auto& x, const auto& y) { return x.second < y.second; });
  b.v.standalone_gemm = fastest->first != StandaloneGemm::comet && fastest->second < kMeasuredGain * ours
                            ? fastest->first
                            : StandaloneGemm::comet;
}

// --gemm-runs / --standalone-runs without --from-results: the table's own sequential-mode entries take the
// width and the standalone GEMM those runs favour (the rules above, with the entry as the sweep's one
// point). Fused entries stay (no sequential-mode time to scale), as do keys the runs do not cover.
void refine_entries(const std::map<std::string, TuneKey>& keys,
                    const std::map<std::string, StandaloneRuns>& standalone, const tune_tool::WidthRatios& widths,
                    TuneTable& table) {
  for (const auto& [s, k] : keys) {
    const TuneEntry* e = table.find(k);
    if (!e || e->variant.n_comm != 0) continue;
    Best b{k, e->variant, e->ms};
    apply_width(s, b, Points{{{b.v.tile_n, 0}, b}}, widths);
    apply_standalone(s, b, standalone, widths);
    if (b.v.tile_n == e->variant.tile_n && b.v.standalone_gemm == e->variant.standalone_gemm) continue;
    if (b.v.standalone_gemm != e->variant.standalone_gemm)  // apply_width printed a width change
      std::printf("  %-78s gemm %s -> %s\n", s.c_str(), to_string(e->variant.standalone_gemm),
                  to_string(b.v.standalone_gemm));
    table.put(k, TuneEntry{b.v, b.ms});
  }
}

// Best fused variant per key and the calibrated cost model per (gpu, link), from benchmark records.
void fill_from_results(const std::vector<json>& records, const Args& a, const tune_tool::WidthRatios& widths,
                       TuneTable& table) {
  std::map<std::string, Best> best;
  std::map<std::string, Points> points;
  std::map<std::string, std::vector<double>> gemm_rate, fp8_rate, link;  // by gpu|link
  std::map<std::string, std::vector<json>> comm_runs;
  std::map<std::string, StandaloneRuns> standalone;
  // Layer-0 gemm_only runs by gpu|link, then case, then tile_n.
  std::map<std::string, std::map<std::string, std::map<int, json>>> gemm_by_tile;
  // A fused record's time at its (tile, n_comm) under key k; a later record replaces an earlier one.
  auto add_point = [&](const TuneKey& k, const json& r) {
    const int tn = r.value("tile_n", 256), nc = r.value("n_comm", 1);
    points[k.str()][{tn, nc}] = Best{k, LayerVariant{tn, nc, 0, 1}, r.value("median_ms", 1e30)};
  };
  for (const json& r : records) {
    if (r.value("system", "") != "comet") continue;
    const std::string layer = r.value("layer", "");
    if (launch_of(r) < 0) continue;
    if (!of_transport(r, a)) continue;
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
    TuneKey k = key_of(r, sms);
    k.load = 1;  // uniform routing is class 1 by definition
    add_point(k, r);
  }
  // Each key's fastest measured point; a point (tile, n_comm) measured again in a later record (a
  // later file on the command line: a newer sweep) replaces the earlier measurement.
  for (const auto& [s, by_point] : points)
    for (const auto& [pt, p] : by_point)
      if (p.ms < best[s].ms) best[s] = p;
  // A tile narrower than 256 replaces the 256-wide one only when it beats its best point by kMeasuredGain.
  for (auto& [s, b] : best) {
    if (b.v.tile_n == 256) continue;
    const Best* wide = nullptr;
    for (const auto& [pt, p] : points[s])
      if (pt.first == 256 && (!wide || p.ms < wide->ms)) wide = &p;
    if (wide && b.ms >= kMeasuredGain * wide->ms) b = *wide;
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
  for (auto& [s, b] : best) apply_standalone(s, b, standalone, widths);
  for (const auto& [s, b] : best) {
    table.put(b.key, TuneEntry{b.v, b.ms});
    const bool ours = b.v.standalone_gemm == StandaloneGemm::comet;
    std::printf("  %-78s n_comm %2d  tile %d  %.3f ms%s%s\n", s.c_str(), b.v.n_comm, b.v.tile_n, b.ms,
                ours ? "" : "  gemm ", ours ? "" : to_string(b.v.standalone_gemm));
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

// The tuner's pick for every measured case against the best of its sweep.
void evaluate(const std::vector<json>& records, const Args& a, const TuneTable& table) {
  struct Case {
    json first;
    int tile_n = 256;
    std::map<int, double> sweep;
  };
  std::map<std::string, Case> cases;
  for (const json& r : records) {
    if (r.value("system", "") != "comet" || r.value("mode", "") != "fused" || r.value("tuned", false)) continue;
    if (!of_transport(r, a)) continue;
    // Each tile's n_comm sweep is a case of its own (the pick is made for that tile), e4m3 ones too.
    const int tile = r.value("tile_n", 256);
    const std::string layer = r.value("layer", "");
    if (launch_of(r) < 0) continue;
    const std::string id = r.value("model", "") + ' ' + r.value("layout", "") + ' ' + r.value("link", "") + ' ' +
                           r.value("routing", "") + " T=" + std::to_string(r.value("tokens_per_rank", 0)) + ' ' +
                           layer + (tile != 256 ? " tile " + std::to_string(tile) : std::string()) +
                           (r.value("dtype", "bf16") != "bf16" ? " " + r.value("dtype", "") : std::string());
    Case& c = cases[id];
    if (c.sweep.empty()) {
      c.first = r;
      c.tile_n = tile;
    }
    c.sweep[r.value("n_comm", 0)] = r.value("median_ms", 0.0);
  }
  int n = 0, within3 = 0, within10 = 0, unmeasured = 0;
  std::printf("%-52s %-10s %-14s %-14s %s\n", "case", "picked_by", "pick", "best", "ratio");
  for (const auto& [id, c] : cases) {
    // What a launch with the adaptive split runs: the table's entry for the batch's load class if it
    // has one; else the host's pick for class 1 (table, else cost model).
    TuneKey key = key_of(c.first, sms_of(c.first, a.sms));
    const TuneEntry* by_load = key.load > 1 ? table.find(key) : nullptr;
    key.load = 1;
    LayerRequest at_tile;
    at_tile.tile_n = c.tile_n;
    const TunedVariant t = by_load ? TunedVariant{by_load->variant, "table_load"}
                                   : pick_variant(table, key, work_of(c.first, a.measured_work), at_tile);
    const auto best = std::min_element(c.sweep.begin(), c.sweep.end(),
                                       [](const auto& x, const auto& y) { return x.second < y.second; });
    const auto it = c.sweep.find(t.variant.n_comm);
    if (it == c.sweep.end()) {
      ++unmeasured;
      std::printf("%-52s %-10s n=%-2d (not in the sweep)\n", id.c_str(), t.picked_by, t.variant.n_comm);
      continue;
    }
    const double ratio = it->second / best->second;
    if (a.dump_work) {  // the case's work and sweep, one JSON line, for offline model fits
      const LayerWork w = work_of(c.first, true);
      json d{{"case", id}, {"layer", w.layer}, {"flops", w.flops}, {"link_bytes", w.link_bytes},
             {"comm_units", w.comm_units}, {"rows_per_unit", w.rows_per_unit}, {"hidden", w.hidden},
             {"topk", w.topk}, {"gemm_n", w.gemm_n}, {"sweep", json::object()}};
      for (const auto& [nc, ms] : c.sweep) d["sweep"][std::to_string(nc)] = ms;
      std::printf("WORK %s\n", d.dump().c_str());
    }
    ++n;
    within3 += ratio <= 1.03;
    within10 += ratio <= 1.10;
    std::printf("%-52s %-10s n=%-2d %7.3f ms  n=%-2d %7.3f ms  %.3f\n", id.c_str(), t.picked_by, t.variant.n_comm,
                it->second, best->first, best->second, ratio);
  }
  std::printf("comet-tune: %d picks: %d within 3 %% of the sweep's best, %d within 10 %%; %d not in the sweep\n", n,
              within3, within10, unmeasured);
}

std::vector<json> read_records(const std::string& path) {
  std::ifstream in(path);
  COMET_REQUIRE(bool(in), "comet-tune: cannot read ", path);
  json j;
  in >> j;
  COMET_REQUIRE(j.is_array(), "comet-tune: ", path, " is not a list of benchmark records");
  return j.get<std::vector<json>>();
}

// Runs the benchmark's sweep in this process for the config; returns the path of its JSON records.
std::string measure(const Args& a) {
  const std::string out = (std::filesystem::temp_directory_path() / ("comet-tune-" + std::to_string(getpid()) + ".json")).string();
  const std::vector<std::string> args{"--models",  a.model,   "--layouts", a.layout, "--links",  a.link,
                                      "--routings", a.routings, "--tokens", a.tokens, "--n-comm", a.n_comm,
                                      "--systems", "comet",    "--layers",  a.layers, "--comm-all", "--out", out};
  std::fprintf(stderr, "comet-tune: measuring with the benchmark's sweep (its progress follows)\n");
  COMET_REQUIRE(bench::run_sweep(args) == 0, "comet-tune: the benchmark sweep failed");
  return out;
}

void lookup_overhead() {
  TuneTable t;
  TuneKey k;
  k.gpu = "NVIDIA H200";
  k.sms = 132;
  k.hidden = 4096, k.ffn = 14336, k.experts = 8, k.topk = 2, k.world = 8, k.ep = 8, k.tp = 1, k.link = Link::host;
  for (int b = 256; b <= 65536; b *= 2)
    for (int layer = 0; layer < 2; ++layer) {
      k.layer = layer;
      k.tokens_bucket = b;
      t.put(k, TuneEntry{LayerVariant{256, 4, 0, 1}, 1.0});
    }
  const MoeShape s{4096, 14336, 8, 2, Activation::swiglu};
  const Parallel p{8, 1};
  auto time_picks = [&](int bucket, const char* what) {
    k.tokens_bucket = bucket;
    const int n = 200000;
    int sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      k.layer = i & 1;
      sink += pick_variant(t, k, expected_work(s, p, k.layer, 4096, 256), tile256()).variant.n_comm;
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
    std::printf("  %-28s %.0f ns per pick (key, expected work, lookup or model)%s\n", what, ns, sink == 42 ? " " : "");
  };
  std::printf("comet-tune: host cost of choosing a variant (done once per layer launch, no device sync)\n");
  time_picks(4096, "table hit:");
  time_picks(1 << 20, "table miss (cost model):");
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InvalidArgument(s + " needs a value");
      return argv[++i];
    };
    if (s == "--table") a.table = value();
    else if (s == "--evaluate") {
      while (i + 1 < argc && argv[i + 1][0] != '-') a.evaluate.push_back(argv[++i]);
    }
    else if (s == "--measured-work") a.measured_work = true;
    else if (s == "--dump-work") a.dump_work = true;
    else if (s == "--from-results") {
      while (i + 1 < argc && argv[i + 1][0] != '-') a.results.push_back(argv[++i]);
    } else if (s == "--entries-only") {
      a.entries_only = true;
    } else if (s == "--tile-runs") {
      while (i + 1 < argc && argv[i + 1][0] != '-') a.tile_runs.push_back(argv[++i]);
    } else if (s == "--gemm-runs") {
      while (i + 1 < argc && argv[i + 1][0] != '-') a.gemm_runs.push_back(argv[++i]);
    } else if (s == "--standalone-runs") {
      while (i + 1 < argc && argv[i + 1][0] != '-') a.standalone_runs.push_back(argv[++i]);
    } else if (s == "--model") a.model = value();
    else if (s == "--layout") a.layout = value();
    else if (s == "--link") a.link = value();
    else if (s == "--tokens") a.tokens = value();
    else if (s == "--n-comm") a.n_comm = value();
    else if (s == "--routings") a.routings = value();
    else if (s == "--layers") a.layers = value();
    else if (s == "--sms") a.sms = std::atoi(value().c_str());
    else if (s == "--transport") a.transport = value();
    else if (s == "--lookup-overhead") a.lookup_overhead = true;
    else if (s == "--what-if-link") a.what_if_gbps = std::atof(value().c_str());
    else if (s == "--latency-scale") a.latency_scale = std::atof(value().c_str());
    else if (s == "--sequential-margin") a.sequential_margin = std::atof(value().c_str());
    else if (s == "--where") {
      where();
      return 0;
    } else {
      std::fprintf(stderr, "usage: comet-tune (--model M [--layout L] [--link host|device] [--tokens LIST] [--n-comm LIST]"
                           " [--routings uniform,zipf1.2]"
                           " | --from-results JSON... [--tile-runs JSON...] [--gemm-runs JSON...]"
                           " [--standalone-runs JSON...] [--entries-only] [--transport T]"
                           " | --gemm-runs JSON... | --standalone-runs JSON...)"
                           " [--table PATH]"
                           " | --evaluate JSON... [--measured-work] [--dump-work] [--sequential-margin X]"
                           " | --what-if-link GBPS [--latency-scale X] [--tokens LIST]"
                           " | --lookup-overhead | --where\n");
      return s == "-h" || s == "--help" ? 0 : 2;
    }
  }
  try {
    if (a.lookup_overhead) {
      lookup_overhead();
      return 0;
    }
    if (a.what_if_gbps > 0) {
      const TuneTable table = a.table == TuneTable::user_path() ? TuneTable::load_default() : TuneTable::load(a.table);
      tune_tool::what_if_link(table, a.what_if_gbps, a.latency_scale,
                              a.tokens == "1024,4096" ? "256,1024,4096,16384" : a.tokens, a.sms > 0 ? a.sms : 132);
      return 0;
    }
    if (!a.evaluate.empty()) {
      std::vector<json> records;
      for (const auto& p : a.evaluate) {
        auto r = read_records(p);
        records.insert(records.end(), r.begin(), r.end());
      }
      TuneTable table = TuneTable::load(a.table);
      if (a.sequential_margin) {
        for (Link link : {Link::host, Link::device}) {
          CostModel m = table.model("NVIDIA H200", link);
          m.sequential_margin = *a.sequential_margin;
          table.set_model("NVIDIA H200", link, m);
        }
      }
      evaluate(records, a, table);
      return 0;
    }
    if (!a.model.empty()) a.results.push_back(measure(a));
    const bool refine = a.results.empty() && (!a.gemm_runs.empty() || !a.standalone_runs.empty());
    if (a.results.empty() && !refine)
      throw InvalidArgument("comet-tune: nothing to do (--model, --from-results, --gemm-runs or --standalone-runs)");
    std::vector<json> records;
    for (const auto& p : a.results) {
      auto r = read_records(p);
      records.insert(records.end(), r.begin(), r.end());
    }
    for (const auto& p : a.tile_runs)
      for (json& r : read_records(p))
        if (r.value("mode", "") == "gemm_only" && r.value("layer", "") == "l0") {
          r["tile_run_only"] = true;
          records.push_back(r);
        }
    std::map<std::string, TuneKey> keys;  // the keys the GEMM runs cover
    std::map<std::string, StandaloneRuns> standalone;
    for (const auto& p : a.standalone_runs)
      for (json& r : read_records(p))
        if (of_transport(r, a) && add_standalone(r, sms_of(r, a.sms), standalone, &keys))
          records.push_back(std::move(r));
    std::vector<tune_tool::GemmRecord> gemm_records;
    for (size_t f = 0; f < a.gemm_runs.size(); ++f)
      for (json& r : read_records(a.gemm_runs[f])) gemm_records.push_back({int(f), std::move(r)});
    const auto widths = tune_tool::width_ratios(gemm_records, [&](const json& r) -> std::optional<std::string> {
      if (launch_of(r) < 0 || !of_transport(r, a)) return std::nullopt;
      TuneKey k = key_of(r, sms_of(r, a.sms));
      k.load = 1;  // uniform routing, as the sweeps' keys
      keys.emplace(k.str(), k);
      return k.str();
    });
    TuneTable table = TuneTable::load(a.table);
    if (refine) {
      std::printf("comet-tune: the sequential-mode entries of %s that the GEMM runs cover\n", a.table.c_str());
      refine_entries(keys, standalone, widths, table);
    } else {
      std::printf("comet-tune: %zu records -> %s\n", records.size(), a.table.c_str());
      fill_from_results(records, a, widths, table);
    }
    table.save(a.table);
    std::printf("comet-tune: table holds %zu entries\n", table.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
