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
//       of those sweeps); --one-launch-runs files (comet-bench --paired --one-launch-ab) set where layer
//       1's sequential entries run as one launch (one_launch_runs.hpp); the weight-gradient records
//       ("wgrad comet") of the --from-results and --wgrad-runs files set each case's weight-gradient GEMM
//       (weight_grad_runs.hpp)
//   comet-tune --gemm-runs JSON... / --standalone-runs JSON... / --one-launch-runs JSON... /
//   --wgrad-runs JSON... (without --from-results)
//       refines the table's own sequential-mode entries with those runs: width, standalone GEMM, one launch;
//       the weight gradients' entries from theirs
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
#include <cstdio>
#include <cstdlib>
#include <filesystem>
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
#include "one_launch_runs.hpp"
#include "weight_grad_runs.hpp"
#include "table_from_results.hpp"
#include "tune_records.hpp"

using namespace comet;
using namespace comet::tune_tool;
using nlohmann::json;

namespace {

struct Args {
  std::string table = TuneTable::user_path();
  std::vector<std::string> results;
  std::vector<std::string> evaluate;
  std::vector<std::string> tile_runs;  // --from-results files used only for the tile shapes' GEMM rates
  std::vector<std::string> gemm_runs;  // --from-results: paired GEMM-alone runs, the n_comm-0 picks' widths
  std::vector<std::string> standalone_runs;  // --from-results: files whose gemm_<name> records alone count
  std::vector<std::string> one_launch_runs;  // comet-bench --one-launch-ab files: one launch or two (layer 1)
  std::vector<std::string> wgrad_runs;       // backward runs: their "wgrad comet" records alone count
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
    if (!of_transport(r, a.transport)) continue;
    // Each tile's n_comm sweep is a case of its own (the pick is made for that tile), e4m3 ones too.
    const int tile = r.value("tile_n", 256);
    const std::string layer = r.value("layer", "");
    if (launch_of(r) < 0) continue;
    const std::string id = r.value("model", "") + ' ' + r.value("layout", "") + ' ' + r.value("link", "") + ' ' +
                           r.value("routing", "") + " T=" + std::to_string(r.value("tokens_per_rank", 0)) + ' ' +
                           layer + (tile != 256 ? " tile " + std::to_string(tile) : std::string()) +
                           (r.value("wave_chunk", 0) > 1 ? " chunk " + std::to_string(r.value("wave_chunk", 0))
                                                         : std::string()) +
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
    } else if (s == "--one-launch-runs") {
      while (i + 1 < argc && argv[i + 1][0] != '-') a.one_launch_runs.push_back(argv[++i]);
    } else if (s == "--wgrad-runs") {
      while (i + 1 < argc && argv[i + 1][0] != '-') a.wgrad_runs.push_back(argv[++i]);
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
                           " [--standalone-runs JSON...] [--one-launch-runs JSON...] [--wgrad-runs JSON...]"
                           " [--entries-only] [--transport T]"
                           " | --gemm-runs JSON... | --standalone-runs JSON... | --one-launch-runs JSON..."
                           " | --wgrad-runs JSON...)"
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
    const bool refine = a.results.empty() && (!a.gemm_runs.empty() || !a.standalone_runs.empty() ||
                                              !a.one_launch_runs.empty() || !a.wgrad_runs.empty());
    if (a.results.empty() && !refine)
      throw InvalidArgument("comet-tune: nothing to do (--model, --from-results, --gemm-runs, --standalone-runs, "
                            "--one-launch-runs or --wgrad-runs)");
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
        if (of_transport(r, a.transport) && add_standalone(r, sms_of(r, a.sms), standalone, &keys))
          records.push_back(std::move(r));
    std::vector<tune_tool::GemmRecord> gemm_records;
    for (size_t f = 0; f < a.gemm_runs.size(); ++f)
      for (json& r : read_records(a.gemm_runs[f])) gemm_records.push_back({int(f), std::move(r)});
    const auto widths = tune_tool::width_ratios(gemm_records, [&](const json& r) -> std::optional<std::string> {
      if (launch_of(r) < 0 || !of_transport(r, a.transport)) return std::nullopt;
      const TuneKey k = uniform_key_of(r, sms_of(r, a.sms));
      keys.emplace(k.str(), k);
      return k.str();
    });
    TuneTable table = TuneTable::load(a.table);
    if (refine) {
      if (!keys.empty())
        std::printf("comet-tune: the sequential-mode entries of %s that the runs cover\n", a.table.c_str());
      refine_entries(keys, standalone, widths, table);
    } else {
      std::printf("comet-tune: %zu records -> %s\n", records.size(), a.table.c_str());
      fill_from_results(records, FromResults{a.sms, a.transport, a.entries_only}, widths, table);
    }
    if (!a.one_launch_runs.empty()) {
      std::vector<json> ab;
      for (const auto& p : a.one_launch_runs)
        for (json& r : read_records(p))
          if (of_transport(r, a.transport)) ab.push_back(std::move(r));
      std::map<std::string, TuneKey> ab_keys;
      const auto pairs = tune_tool::one_launch_pairs(ab, a.sms, ab_keys);
      std::printf("comet-tune: layer 1's sequential entries against %zu one-launch A/B pairs\n", pairs.size());
      tune_tool::apply_one_launch(pairs, ab_keys, tune_tool::kMeasuredGain, table);
    }
    std::map<std::string, tune_tool::WeightGradRuns> wgrad;  // one run per file
    for (const auto* files : {&a.results, &a.wgrad_runs})
      for (const auto& p : *files) {
        std::vector<json> run;
        for (json& r : read_records(p))
          if (of_transport(r, a.transport)) run.push_back(std::move(r));
        tune_tool::add_weight_grad_runs(run, a.sms, wgrad);
      }
    if (!wgrad.empty()) {
      std::printf("comet-tune: the weight gradients' GEMM of %zu cases\n", wgrad.size());
      tune_tool::apply_weight_grad_runs(wgrad, table);
    }
    table.save(a.table);
    std::printf("comet-tune: table holds %zu entries\n", table.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
