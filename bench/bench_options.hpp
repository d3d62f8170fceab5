// Command line of comet-bench (see usage() in bench_options.cpp for the flags and their defaults).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comet/plan.hpp"
#include "comet/variant.hpp"

namespace comet::bench {

struct BenchOptions {
  std::vector<std::string> models{"mixtral", "qwen2", "phi35", "qwen57", "deepseek"};
  std::vector<std::string> layouts{"ep8", "tp8", "ep4tp2"};
  std::vector<std::string> links{"host", "device"};
  std::vector<std::string> routings{"uniform", "zipf1.2"};
  std::vector<int> tokens{1024, 2048, 4096, 8192, 16384};
  std::vector<int> n_comm{1, 2, 4, 8, 16, 24, 32};
  std::vector<std::string> layers{"l0", "l1", "fwd"};
  std::vector<std::string> systems{"cublas", "comet", "sequential", "chunked"};
  std::vector<int> chunks{2, 4, 8};
  int chunk_comm_blocks = 16;
  bool fused_activation_grad = false;  // also time comet's backward with BackwardOptions::fused_activation
  bool standalone_gemms = false;  // records of every standalone GEMM (StandaloneGemm) of layers 1-3
  bool one_launch_ab = false;  // --paired: also the tuned layer 1 / forward with LayerRequest::one_launch flipped
  WeightGradKernel wgrad_kernel = WeightGradKernel::automatic;  // BackwardOptions::weight_grad_kernel of comet's backward
  bool narrow_n_tiles = true;  // MoeOptions::narrow_n_tiles (--no-narrow-n-tiles: off, for A/B runs)
  std::optional<bool> cublas_backward;  // MoeOptions::cublas_backward (--cublas-backward / --no-...: A/B runs)
  bool adaptive = true;  // comet's tuned runs with MoeOptions::adaptive_split (n_comm re-picked on the device)
  bool check_schedule = false;  // MoeOptions::check_schedule, settled before any tuned timing (--check-schedule)
  std::string tune_table;       // MoeOptions::tune_table (--tune-table FILE: that table alone; empty: the default)
  int tile_n = 256;
  int m_group = 0;  // --m-group: forced launches' M-tile group (0: the planner's rule)
  bool m_order = false;  // --tile-order m: forced fused layer-0 launches compute in m order (LayerRequest::m_order)
  int wave_chunk = 0;    // --wave-chunk: MoeOptions::wave_chunk (0: the library's default)
  std::optional<PullOrder> pull_order;  // --pull-order: MoeOptions::pull_order (none: the library's default)
  bool expert_by_size = false;  // --expert-order size: layer 0 pulled expert by expert, smallest expert first
                                //   (harness/plan_rewrite.hpp rewrites the plan after each prepare)
  std::string dtype = "bf16";  // layer 0's inputs: bf16 or e4m3 (MoeOptions::dtype)
  bool tuned_tile = false;  // tuned records: the tuner picks the width as well
  int reps = 10;
  int warmup = 2;
  bool comm_all = false;       // comm_only at every n_comm of the sweep (default: at the best fused one)
  std::string trace_dir;       // --trace: layer 0's timelines, one JSON per case (layer0_trace.hpp)
  bool paired = false;         // re-time each layer's tuned comet run and sequential baseline in rotation
  bool estimate_only = false;  // print the cases, what is skipped and the time estimate; run nothing
  double mem_limit_gib = 0;    // device memory the benchmark may use; 0: free memory less 6 GiB
  double host_limit_gib = 96;  // pinned host memory (link=host puts the exported buffers there)
  unsigned long long seed = 1;
  std::string out;     // JSON path; the markdown table goes next to it (.md)
  std::string commit;  // --commit, else $COMET_COMMIT, else "unknown"
  bool quick = false;

  bool has_layer(const std::string& l) const;
  bool has_system(const std::string& s) const;
  // The layer is built for training: a backward, or one of its fused launches (l2, l3), is measured.
  bool has_backward() const {
    return has_layer("bwd") || has_layer("fwd+bwd") || has_layer("l2") || has_layer("l3");
  }
};

// Parses argv; prints usage and exits on --help; throws InvalidArgument on bad flags.
BenchOptions parse_options(int argc, char** argv);

}  // namespace comet::bench
