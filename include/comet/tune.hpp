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

constexpr int kLoadClasses = 4;  // TuneKey::load: 1, 2, 4, 8

// What a pick depends on. tokens_bucket is the smallest power of two >= tokens per rank (>= 256).
// The fused launches the planner and the tuner know, by id ("layer" in keys, records and tables):
//   0  layer 0 (dispatch + GEMM0)      1  layer 1 (GEMM1 + combine)
//   2  the backward of layer 1: layer 0's kind of kernel (pull of output gradients + G W1)
//   3  the backward of layer 0: layer 1's kind of kernel (dPre W0 + combine)
inline constexpr int kLaunchLayers = 4;
// Not a fused launch: the weight gradients' GEMM (no comm). Its keys ("l4") hold the measured
// WeightGradKernel of a case (LayerVariant::weight_grad; comet-tune --wgrad-runs).
inline constexpr int kWeightGradLaunch = 4;
// 0: the comm blocks pull (layers 0 and 2), 1: they combine (layers 1 and 3).
inline constexpr int comm_kind(int layer) { return layer % 2; }

struct TuneKey {
  std::string gpu;  // device name, e.g. "NVIDIA H200"
  int sms = 0;
  int layer = 0;  // a launch id above: 0..3, or kWeightGradLaunch
  int hidden = 0, ffn = 0, experts = 0, topk = 0;
  int world = 0, ep = 0, tp = 0;
  Link link = Link::device;
  int tokens_bucket = 0;
  std::string dtype = "bf16";
  // The batch's load class (cost_model_eval.hpp: load_class): 1 for uniform routing, 2/4/8 for a rank
  // that skew gives that many times its uniform rows. Entries of classes > 1 are looked up on the
  // device (adaptive split), the host's own picks are made for class 1.
  int load = 1;

  std::string str() const;  // canonical form, the table's key
};

int tokens_bucket(int tokens_per_rank);

// Rows of one rank under uniform routing: every rank's tokens x k, spread over the ep groups.
double expected_rows(const MoeShape& s, const Parallel& p, int tokens_per_rank);

// The work of one rank's layer, as the cost model sees it.
struct LayerWork {
  int layer = 0;             // the comm kind (comm_kind): 0 pull, 1 combine
  double flops = 0;          // GEMM flops over the real rows
  double link_bytes = 0;     // bytes that cross the link (remote rows pulled, or partial rows shipped)
  double comm_units = 0;     // units the comm blocks handle (layer 0: remote ones; layer 1: all)
  double rows_per_unit = 1;  // destination rows per unit (a token's experts on this rank)
  int hidden = 0;
  int topk = 1;
  int gemm_n = 0;            // the GEMM's N (layer 0: W0 rows of the shard; 1 and 3: H; 2: F/tp); 0: unknown
  bool backward = false;     // a backward kernel (launch 2 or 3): compiled tiles 128 and 256 only
  // What a unit moves, per destination row: 2H for bf16 rows; layer 0 in e4m3 moves the packed record
  // (fp8::record_bytes(H): codes, 1 x 128 scales, padding), about half. 0 reads as 2H (a LayerWork
  // filled by hand).
  double row_bytes = 0;
  bool fp8 = false;          // the GEMM runs in e4m3 (layer 0 with DType::e4m3): CostModel's fp8 rate
};

// One row's work: the layer's shape fields (layer, hidden, topk, gemm_n, row_bytes, fp8) and, in
// `flops`, the GEMM flops of a single row; the counts are 0. measured_work (cost_model_eval.hpp) scales
// it by a plan's counts. `dtype` is layer 0's (the other launches are bf16).
LayerWork row_work(const MoeShape& s, const Parallel& p, int layer, DType dtype = DType::bf16);

// Expected work of one rank for a shape, layout and tokens per rank under uniform routing.
LayerWork expected_work(const MoeShape& s, const Parallel& p, int layer, int tokens_per_rank, int tile_n,
                        DType dtype = DType::bf16);

// The cost model, with rates measured on one GPU and link (comet-tune calibrates them from a sweep;
// the defaults are H200 readings over the host link, bench/results/h200_host_full_a.json):
//   T_gemm  = flops / (gemm rate per SM x compute blocks)   (e4m3 layer 0: the fp8 rate, its one 128-wide tile)
//   T_block = units x unit time / n  (a comm block is latency-bound: measured, a 4 KB row costs it
//             about what an 8 KB row does)
//             layer 0 unit: l0_unit_us + its destination rows' bytes / l0_store_gbps (local bulk stores;
//             a row is 2H bytes, an e4m3 record about H)
//             layer 1 unit: l1_slice_us x 256-column chunks x top-k / 16 (the combine's batches)
//   T_link  = link bytes / link_gbps;   T_comm = (T_block^4 + T_link^4)^(1/4)  (a smooth max)
//   T_fused = max(T_gemm, T_comm) + overlap_penalty x min(T_gemm, T_comm)
//   n_comm 0 (sequential mode): T_comm with every SM pulling, plus T_gemm on every SM
// Tile shape: T_gemm above is for 128x256 tiles. A 128x128 (or, in layer 0, 128x192) tile computes N
// padded to its width instead of 256 at tile128_efficiency (tile192_efficiency) of the rate, so it wins
// only where 256-wide tiles waste many columns (Qwen2 tp 8: N = 352, 31 % padding; 9 % with either).
struct CostModel {
  double gemm_tflops_per_sm = 4.61;  // bf16 GEMM rate of one SM in the fused kernel
  // e4m3 GEMM rate of one SM in the fused layer 0 (128 x 128 tiles, 1 x 128 / 128 x 128 block scales):
  // H200, the 16 gemm_only e4m3 records of bench/results/h200_fp8_first_84131cc.json (Mixtral and
  // DeepSeek-V3, EP 8 / TP 8, 4096 / 16384 tokens, 824-1125 TFLOP/s), median 1044 TFLOP/s / 132 SMs;
  // comet-tune fits it from e4m3 gemm_only runs.
  double fp8_gemm_tflops_per_sm = 7.91;
  double l0_unit_us = 0.50;          // a layer-0 comm block: fixed time per pulled unit
  double l0_store_gbps = 200.0;      // and its local stores into the gathered rows
  double l1_slice_us = 0.40;         // a layer-1 comm block: time per (256 columns x 16 slots)
  double link_gbps = 52.0;           // ceiling of the link, all blocks together
  double overlap_penalty = 0.3;      // the part of the shorter side that does not hide
  // 128x128 against 128x256 tiles at equal padding, GEMM only (comet-tune fits both from side-by-side
  // runs; the defaults and their source: docs/design-changes.md, Data layout and GEMM).
  double tile128_efficiency = 0.87;
  double tile192_efficiency = 0.95;  // an estimate until comet-tune has runs of both shapes to fit it
  // Sequential mode (n_comm 0: communication on every SM, then the GEMM) is picked only when predicted
  // faster than every comm-block count by this fraction.
  double sequential_margin = 0.05;
  double unit_us(const LayerWork& w) const;
  // T_gemm of a tile shape relative to 128x256 tiles (1 for 256).
  double tile_factor(const LayerWork& w, int tile_n) const;
  // The compiled tile shape (128, 256, and 192 in layer 0) with the smallest T_gemm; a narrower one only
  // where it predicts at most kNarrowTileGain of the 256-wide tile's time (its efficiency is a median with
  // a wide spread), the rule a width replacing a table's follows too (pick_variant). Layer 1's 192-wide
  // tile is the table's alone: its gain is the last wave's (the model has no waves).
  int best_tile_n(const LayerWork& w) const;

  static CostModel defaults(Link link);
  // Predicted time (ms) of the fused layer with n_comm comm blocks out of `sms`, 128x256 tiles
  // (other tile_n: T_gemm scaled by tile_factor).
  double predict_ms(const LayerWork& w, int n_comm, int sms, int tile_n = 256) const;
  // The candidate n_comm (2, 4, 8, 16, 24, 32, at most 40 % of sms) with the least predicted time;
  // the fewest blocks among those within 1 % of it; 0 (sequential mode) if that is predicted
  // sequential_margin faster still.
  int best_n_comm(const LayerWork& w, int sms, int tile_n = 256) const;
};

// A narrower tile than 256 is picked only where it predicts at most this fraction of the 256-wide tile's
// T_gemm. H100, same run (bench/results/h100_unseen_gpu_device_tunedtile_7f7887f.json): Qwen2-57B TP 8's
// layer 0 (N 640: 768 columns at 256, 640 at 128, predicted 0.96) took 1.21x as long with 128-wide tiles
// at 16384 tokens and 1.09x at 4096; Qwen2 TP 8's (N 352, 192 predicted 0.79) was 1.21x faster at 192.
constexpr double kNarrowTileGain = 0.9;

struct TuneEntry {
  LayerVariant variant;
  double ms = 0;  // measured time of the pick
};

// The persisted table (JSON). Two of them make the table a FusedMoe uses by default (load_default):
//  * the shipped table: measured on the H200, plus 207 bf16 H100 entries, 58 of them the backward's
//    launches' and 29 the weight gradients' (bench/results/h200_tune_table.json; keys carry the GPU's
//    name), installed with comet
//    (the Python package carries it as package data and points shipped_path() at it);
//  * the user's table, which comet-tune fills: $COMET_TUNE_TABLE, else $XDG_CACHE_HOME/comet/tune.json,
//    else ~/.cache/comet/tune.json. Its entries and models override the shipped ones key by key.
class TuneTable {
 public:
  static std::string user_path();
  static std::string shipped_path();
  static void set_shipped_path(const std::string& path);  // process-wide (the Python package sets it)
  static TuneTable load_default();                         // shipped, overlaid by the user's
  static TuneTable load(const std::string& path);  // a missing file gives an empty table
  void save(const std::string& path) const;        // creates the folder
  void overlay(const TuneTable& over);             // over's entries and models replace this one's

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
  const char* picked_by = "";  // "table", "table+tile" (the table's n_comm, the model's tile), "cost_model"
};

// Table first, cost model second, for what `request` leaves open: the tile shape (the table's entry,
// else the model's best) and n_comm (the table's, else the model's pick for that tile). m_group and
// n_group are the request's, else the table entry's (m_group 0: the planner's rule), else 0 and 1.
// A field the request sets is always kept.
TunedVariant pick_variant(const TuneTable& table, const TuneKey& key, const LayerWork& work,
                          const LayerRequest& request);

}  // namespace comet
