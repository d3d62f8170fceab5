// comet-tune --gemm-runs: the tile width of sequential-mode entries from GEMM-alone runs.
//
// A sequential-mode pick (n_comm 0: the comm on every SM, then the GEMM, or the GEMM, then the combine)
// spends its GEMM time in our kernel alone, so its tile width is the one whose GEMM is fastest. Runs of
// `comet-bench --systems cublas,comet --n-comm 0 --paired --tile-n W` (scripts/device-goals: one run
// per width) measure exactly that, but each width in a run of its own, and on a power-capped card two
// runs drift by more than the widths differ. What compares across runs is each run's ratio of our GEMM
// to cuBLAS's, timed in rotation in the same run: cuBLAS is the same in every run, so it cancels the
// drift.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace comet::tune_tool {

// Per key (the caller's key string of a record), per tile width: our GEMM-alone time over cuBLAS's in the
// same run (median over the runs that measured the width). Records other than the paired gemm_only and
// cuBLAS ones are ignored, and so are gemm_only records that timed a standalone GEMM the table picked
// (picked_by other than comet); `file` tells records of separate runs apart.
struct GemmRecord {
  int file = 0;
  nlohmann::json record;
};
using WidthRatios = std::map<std::string, std::map<int, double>>;
WidthRatios width_ratios(const std::vector<GemmRecord>& records,
                         const std::function<std::optional<std::string>(const nlohmann::json&)>& key_of);

// The width to run from one key's ratios: 256 unless a narrower width's ratio beats 256's by `gain`
// (a factor below 1, closer is noise); nothing without a 256-wide measurement.
std::optional<int> width_pick(const std::map<int, double>& ratios, double gain);

}  // namespace comet::tune_tool
