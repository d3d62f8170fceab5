// comet-bench --trace DIR: the timeline of layer 0's launches of a case (kernels/launch_trace.hpp), one
// traced launch per mode and n_comm of the sweep, written with rank 0's plan as one JSON file per case
// for bench/trace_timeline.py: when each comm block ended, when each M-tile's rows were all in, and
// when each compute block waited for and started each (M-tile, N-block).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "harness/device_buffer.hpp"
#include "ops/moe_engine.hpp"

namespace comet::bench {

class Layer0Tracer {
 public:
  Layer0Tracer(MoeEngine& moe, int tile_n);

  // `pre` untraced, then `launch` with rank 0's trace on; synchronises and keeps the stamps.
  void trace(const std::string& mode, int n_comm, double median_ms, const std::function<void()>& pre,
             const std::function<void()>& launch);
  // The runs and rank 0's plan (as the last traced launch left it), `header` (JSON members, no braces)
  // first.
  void write(const std::string& path, const std::string& header) const;

 private:
  struct Run {
    std::string mode;
    int n_comm = 0;
    double median_ms = 0;
    std::vector<unsigned long long> stamps;
  };
  MoeEngine& moe_;
  int tile_n_;
  kernels::LaunchTrace layout_;
  testing::DeviceBuffer stamps_;
  std::vector<Run> runs_;
};

}  // namespace comet::bench
