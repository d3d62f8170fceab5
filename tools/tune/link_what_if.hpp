// comet-tune --what-if-link: the cost model's answer for a link we cannot measure on one GPU (NVLink,
// about 450 GB/s each way). It takes the device link's calibrated model (per-block comm costs measured
// over HBM, the GEMM rate per SM), replaces the link ceiling and scales the per-unit comm latency (an
// NVLink access costs more than an HBM one), and prints, for every case of the benchmark's full sweep
// under uniform routing, the predicted sequential mode (comm on every SM, then the GEMM) against the
// best fused split. A prediction, not a measurement.
#pragma once

#include <string>

#include "comet/tune.hpp"

namespace comet::tune_tool {

void what_if_link(const TuneTable& table, double link_gbps, double latency_scale, const std::string& tokens_csv,
                  int sms);

}  // namespace comet::tune_tool
