// How a launch decision runs: the fused schedule is one launch; the sequential schedule (n_comm 0) is
// the communication and the GEMM as two launches, each over the whole GPU. A pull (layer 0 and the
// backward of layer 1) runs before its GEMM, and not at all with one rank; a combine (layer 1 and the
// backward of layer 0) runs after its GEMM, or, with d.one_launch, in the same launch (each block's
// combine after its last tile). `launch(l)` launches the kernel with l.split as set;
// `gemm(l)` runs a launch whose split is gemm_only (it may run another GEMM: d.standalone_gemm).
#pragma once

#include "comet/variant.hpp"

namespace comet {

template <class Launch, class LaunchFn, class GemmFn>
void run_schedule(Launch& l, const LaunchDecision& d, bool pull, int world, LaunchFn&& launch, GemmFn&& gemm) {
  auto run = [&] { l.split.mode == LayerMode::gemm_only ? gemm(l) : launch(l); };
  if (d.schedule == Schedule::sequential) {
    if (pull) {
      if (world > 1) {
        l.split.mode = LayerMode::comm_only;
        l.split.n_comm = d.resident_blocks;
        launch(l);
      }
      l.split.mode = LayerMode::gemm_only;
    } else if (d.one_launch) {
      l.split.one_launch = true;  // fused mode, no comm blocks: GEMM, then combine, in every block
    } else {
      l.split.mode = LayerMode::gemm_only;
      gemm(l);
      l.split.mode = LayerMode::comm_only;
      l.split.n_comm = d.resident_blocks;
    }
  }
  run();
}

}  // namespace comet
