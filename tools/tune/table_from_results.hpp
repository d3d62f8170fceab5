// comet-tune --from-results / --gemm-runs / --standalone-runs: table entries (and, unless entries_only, the
// cost models) from benchmark records measured anywhere.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comet/tune.hpp"
#include "comet/variant.hpp"
#include "gemm_width_runs.hpp"

namespace comet::tune_tool {

// A narrower tile than 256, a standalone GEMM or one launch replaces ours only when it beats it by 3 %:
// closer is noise (Mixtral EP 4 x TP 2 layer 1 at 4096 tokens "won" at 192 by 0.01 % in run 37's sweep and
// then ran 15 % slower in the validation; the sequential point was timed with our GEMM).
constexpr double kMeasuredGain = 0.97;
// cuBLAS's GEMM is the sequential baseline's: where it is the fastest one measured for a sequential-mode
// pick, running it makes comet's sequential schedule the baseline's GEMM and our combine, so a smaller
// lead takes it (1 %: the H100's layer 1 trailed the baseline by 2-3 % where cuBLAS led our GEMM by as
// much, 2026-12-07, bench/results/h100_cublas_l1_97fc7c1/).
constexpr double kCublasGain = 0.99;

struct FromResults {
  int sms = 0;                         // > 0: every record's SM count (--sms)
  std::string transport = "cuda_ipc";  // comet-bench-ipc records of this transport only
  bool entries_only = false;           // the picks only, no cost-model refit
};

// One key's standalone-GEMM runs (comet-bench --standalone-gemms: modes gemm_<name>), by the width ours ran at.
using StandaloneRuns = std::map<int, std::map<StandaloneGemm, double>>;

// A gemm_<name> record into `runs` under its key (uniform routing), and the key into `keys` if given;
// false for other records.
bool add_standalone(const nlohmann::json& r, int sms, std::map<std::string, StandaloneRuns>& runs,
                    std::map<std::string, TuneKey>* keys = nullptr);

// The best variant per key from the records' sweeps (the narrow-tile, width and standalone-GEMM rules
// applied) into `table`, and the cost model per (gpu, link) unless entries_only.
void fill_from_results(const std::vector<nlohmann::json>& records, const FromResults& options,
                       const WidthRatios& widths, TuneTable& table);

// The table's own sequential-mode entries of `keys` refined by the width and standalone-GEMM rules.
void refine_entries(const std::map<std::string, TuneKey>& keys,
                    const std::map<std::string, StandaloneRuns>& standalone, const WidthRatios& widths,
                    TuneTable& table);

}  // namespace comet::tune_tool
