// comet-tune --one-launch-runs: where layer 1's sequential schedule with our GEMM runs faster as one launch
// (the GEMM, then the combine, in the same blocks: LaunchDecision::one_launch) than as two.
//
// comet-bench --paired --one-launch-ab times, for each case whose tuned layer 1 takes that schedule, the
// tuned run and the same decision with one_launch flipped in one rotation with the sequential baseline
// (the tuned record, and a record of mode ab_one_launch_off or ab_one_launch_on). The entry of the case's
// key takes one launch where it ran at least 3 % faster than two (closer is noise), and two otherwise;
// with several runs of a case, by the median of their ratios (one run per file: ratios near the line
// move by a few % between runs on a power-capped card).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comet/tune.hpp"

namespace comet::tune_tool {

// One case's runs: each run's two-launch time over its one-launch time, at the tile the tuned run had.
struct OneLaunchPair {
  std::vector<double> two_over_one;
  int tile_n = 0;
};

// The pairs of layer-1 records under uniform routing, by key (into `keys` too).
std::map<std::string, OneLaunchPair> one_launch_pairs(const std::vector<nlohmann::json>& records, int sms,
                                                      std::map<std::string, TuneKey>& keys);

// Sets or clears one_launch on each pair's table entry where that entry is the pair's decision (n_comm 0,
// our GEMM, the pair's tile); prints every change. `gain`: the factor one launch must beat two by.
void apply_one_launch(const std::map<std::string, OneLaunchPair>& pairs, const std::map<std::string, TuneKey>& keys,
                      double gain, TuneTable& table);

}  // namespace comet::tune_tool
