// Adaptive workload assignment: which compiled variant and how many comm blocks a fused layer runs
// with. A persisted table of measured picks (filled by the comet-tune command) answers known problems
// by lookup; a cost model answers the rest. Selection happens on the host before a launch: a hash-map
// lookup (or a few dozen arithmetic operations), no compilation, no device synchronisation.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comet/shape.hpp"
#include "comet/team.hpp"
#include "comet/variant.hpp"

namespace comet {

// What a pick depends on. tokens_bucket is the smallest power of two >= tokens per rank (>= 256).
struct TuneKey {
  std::string gpu;  // device name, e.g. "NVIDIA H200"
  int sms = 0;
  int layer = 0;  // 0 or 1
  int hidden = 0, ffn = 0, experts = 0, topk = 0;
  int world = 0, ep = 0, tp = 0;
  Link link = Link::device;
  int tokens_bucket = 0;
  std::string dtype = "bf16";

  std::string str() const;  // canonical form, the table's key
};

int tokens_bucket(int tokens_per_rank);

// The work of one rank's layer, as the cost model sees it.
struct LayerWork {
  int layer = 0;
  double flops = 0;       // GEMM flops over the real rows
  double link_bytes = 0;  // bytes that cross the link (remote rows pulled, or partial rows shipped)
  double link_rows = 0;   // rows that cross it (a comm block's cost is per row, whatever its size)
  int column_groups = 1;  // layer 1: groups of column blocks the comm ships in turn
};

// Expected work of one rank for a shape, layout and tokens per rank under uniform routing.
LayerWork expected_work(const MoeShape& s, const Parallel& p, int layer, int tokens_per_rank, int tile_n);

// The cost model, with rates measured on one GPU and link (comet-tune calibrates them from a sweep;
// the defaults are H200 readings over the host link, bench/results/h200_host_full_a.json):
//   T_gemm = flops / (gemm rate per SM x compute blocks)
//   T_comm = bytes / R(n), where one comm block moves a row every row_us (measured: the same time for
//            4 KB and 8 KB rows, i.e. a block is latency-bound, not byte-bound) and n blocks approach the
//            link's ceiling smoothly: R(n) = ((n b)^-4 + link^-4)^(-1/4), b = row bytes / row_us
//   T_fused = max(T_gemm, T_comm) + overlap_penalty x min(T_gemm, T_comm)
struct CostModel {
  double gemm_tflops_per_sm = 4.6;  // bf16 GEMM rate of one SM in the fused kernel
  double l0_row_us = 0.55;          // a layer-0 comm block: time per pulled row
  double l1_row_us = 0.80;          // a layer-1 comm block: time per shipped partial row
  double link_gbps = 50.0;          // ceiling of the link, all blocks together
  double overlap_penalty = 0.3;     // the part of the shorter side that does not hide

  static CostModel defaults(Link link);
  // Predicted time (ms) of the fused layer with n_comm comm blocks out of `sms`.
  double predict_ms(const LayerWork& w, int n_comm, int sms) const;
  // The candidate n_comm (2, 4, 8, 16, 32, at most 40 % of sms) with the least predicted time; the
  // fewest blocks among those within 1 % of it.
  int best_n_comm(const LayerWork& w, int sms) const;
};

struct TuneEntry {
  LayerVariant variant;
  double ms = 0;  // measured time of the pick
};

// The persisted table. JSON file at $COMET_TUNE_TABLE, else $XDG_CACHE_HOME/comet/tune.json, else
// ~/.cache/comet/tune.json.
class TuneTable {
 public:
  static std::string default_path();
  static TuneTable load(const std::string& path);  // a missing file gives an empty table
  void save(const std::string& path) const;        // creates the folder

  const TuneEntry* find(const TuneKey& key) const;
  void put(const TuneKey& key, const TuneEntry& entry);
  size_t size() const { return entries_.size(); }

  // Cost model for a GPU and link: calibrated if the table has one, else the defaults.
  CostModel model(const std::string& gpu, Link link) const;
  void set_model(const std::string& gpu, Link link, const CostModel& m);

 private:
  std::map<std::string, TuneEntry> entries_;
  std::map<std::string, CostModel> models_;
};

// The choice for one launch, and where it came from.
struct TunedVariant {
  LayerVariant variant;
  const char* picked_by = "";  // "table", "cost_model"
};

// Table first, cost model second. `base` gives the knobs a pick does not set (its m_group/n_group).
TunedVariant pick_variant(const TuneTable& table, const TuneKey& key, const LayerWork& work, const LayerVariant& base);

}  // namespace comet
