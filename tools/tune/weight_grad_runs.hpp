// comet-tune --wgrad-runs: the GEMM the backward makes its weight gradients with, measured per case.
//
// comet-bench's backward cases time each weight-gradient GEMM alone ("wgrad comet" records: mode
// gemm_only is our persistent kernel, grouped and grouped_cooperative CUTLASS's). A case's entry (key
// layer kWeightGradLaunch, comet/tune.hpp) takes the fastest; with several runs of a case, by the median
// of each kernel's time over the persistent kernel's in the same run (the runs of a power-capped card
// drift more than the kernels differ). The planner prefers an entry to its rule by shape
// (LaunchPlanner::weight_grad_kernel).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comet/tune.hpp"

namespace comet::tune_tool {

struct WeightGradRuns {
  TuneKey key;
  std::map<WeightGradKernel, std::vector<double>> over_persistent;  // per run: ms / the persistent kernel's
  std::map<WeightGradKernel, std::vector<double>> ms;
};

// Adds one run's (one file's) cases with uniform routing, by key.
void add_weight_grad_runs(const std::vector<nlohmann::json>& records, int sms,
                          std::map<std::string, WeightGradRuns>& runs);

// Sets each case's entry to its fastest kernel; prints every case and marks the entries that change.
void apply_weight_grad_runs(const std::map<std::string, WeightGradRuns>& runs, TuneTable& table);

}  // namespace comet::tune_tool
