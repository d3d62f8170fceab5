// Benchmark results in DESIGN.md section 5's format: one record per measured case and system, written
// as a JSON list, and a markdown table of the same results (one row per case and layer).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace comet::bench {

// What identifies a case: every record of one case shares it.
struct CaseKey {
  std::string model;
  std::string layout;  // ep8, tp8, ep4tp2
  int world = 0, ep = 0, tp = 0;
  std::string link;  // host, device
  int tokens_per_rank = 0;
  std::string routing;  // uniform, zipf1.2, one_expert
};

struct Record {
  CaseKey key;
  std::string layer;   // l0, l1, fwd, bwd, fwd+bwd, wgrad (the weight-gradient GEMMs alone), dgrad (the data-gradient GEMMs alone)
  std::string system;  // cublas, sequential, chunked, comet
  std::string dtype = "bf16";  // layer 0's inputs (e4m3: cublas and sequential are cuBLASLt's fp8)
  double median_ms = 0;
  std::optional<double> tflops;  // over the real rows; none for comm-only records
  // comet only
  std::optional<int> n_comm;
  std::string mode;  // gemm_only, comm_only, fused ("" for other systems)
  // extras
  std::optional<double> gb_s;                 // bytes that crossed the link / time (comm-only, fused, baselines)
  std::optional<double> overlap_efficiency;   // fused: T_fused / max(T_gemm, T_comm at the same n_comm)
  std::optional<double> t_seq_ms;             // fused: T_comm + T_gemm at the same n_comm
  std::optional<int> chunks;                  // chunked: remote chunks used
  std::optional<int> chunks_requested;
  std::string cublas_path;                    // cublas / baselines: grouped or loop
  std::optional<double> other_path_ms;        // cublas: the slower path's median
  std::optional<int> n_comm_l1;               // comet fwd, bwd: layer 1's kernel's n_comm (n_comm holds layer
                                              // 0's kernel's; in bwd they run the backward of layer 1, of 0)
  bool best = false;                          // comet fused: the best n_comm of its sweep
  bool tuned = false;                         // comet fused: the tuner's pick (n_comm < 0 resolved)
  bool paired = false;                        // timed in rotation with its counterpart (--paired)
  std::string picked_by;                      // tuned: "table" or "cost_model" (fwd, bwd: layer 0 / layer 1)
  std::string tile_order;                     // "m": a forced fused layer 0 in m order (--tile-order m)
  std::string pull_order;                     // --pull-order's, "source" or "expert" (MoeOptions::pull_order)
  int wave_chunk = 0;                         // --wave-chunk's, or a tuned layer 0's table chunk (0: the default)
  int tile_n = 0;
  int samples = 0;
  double min_ms = 0, max_ms = 0;
  long long rows = 0;         // rank 0's real rows
  long long link_rows = 0;    // rows that crossed the link (layer 0: pulled units; layer 1: shipped partials)
  // The group's layer, built once at the largest case's capacity: FusedMoe::device_bytes_per_rank (a
  // computing rank's private and symmetric buffers), its T_cap and rows_cap.
  long long layer_bytes_per_rank = 0;
  int tokens_cap = 0, rows_cap = 0;
  // comet-bench-ipc (one process per rank): how the ranks reach each other: cuda_ipc (CUDA IPC
  // pointers), nvshmem_heap (NVSHMEM's heap through pointers), nvshmem (NVSHMEM's device transport);
  // "" for the one-process benchmark.
  std::string transport;
};

struct RunInfo {
  std::string gpu;
  std::string commit;
  int sms = 0;  // the GPU's SM count (the tuner's keys carry it); 0: unknown, not written
};

std::string to_json(const std::vector<Record>& records, const RunInfo& info);
std::string to_markdown(const std::vector<Record>& records, const RunInfo& info);

// Writes the JSON and, next to it (extension .md), the markdown table; creates the folder.
void write_results(const std::string& json_path, const std::vector<Record>& records, const RunInfo& info);

}  // namespace comet::bench
