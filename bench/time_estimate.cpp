#include "time_estimate.hpp"

#include <algorithm>
#include <set>

namespace comet::bench {
namespace {

// Rates seen on the H200 (DESIGN.md section 3 and 4), rounded down.
constexpr double kGemmFlops = 600e12;          // bf16 grouped GEMM, large problems
constexpr double kHostLinkBytes = 45e9;        // PCIe, one direction
constexpr double kHostBlockBytes = 30e9;       // one bulk-copy comm block over PCIe
constexpr double kDeviceLinkBytes = 1.2e12;    // HBM-to-HBM copies
constexpr double kDeviceBlockBytes = 45e9;     // one bulk-copy comm block over HBM
constexpr double kPerRepOverheadMs = 0.08;     // spin, prepare, launches, event records
constexpr int kResidentBlocks = 132;

double comm_ms(double bytes, Link link, int blocks) {
  const double bw = link == Link::host ? std::min(kHostLinkBytes, blocks * kHostBlockBytes)
                                       : std::min(kDeviceLinkBytes, blocks * kDeviceBlockBytes);
  return bytes / bw * 1e3;
}

}  // namespace

CaseCost estimate_case(const BenchOptions& o, const MoeShape& shape, const Parallel& par, Link link,
                       const RoutingStats& stats) {
  const double H = shape.hidden, fs = par.ffn_shard(shape), n0 = is_gated(shape.act) ? 2 * fs : fs;
  const double rows = double(stats.rank0_rows), bytes = double(stats.rank0_remote_units) * H * 2;
  CaseCost c;
  c.gemm0_ms = 2 * rows * n0 * H / kGemmFlops * 1e3 + 0.01;
  c.gemm1_ms = 2 * rows * H * fs / kGemmFlops * 1e3 + 0.01;
  c.comm0_ms = comm_ms(bytes, link, kResidentBlocks);
  c.comm1_ms = comm_ms(bytes, link, kResidentBlocks);
  const double gemm = c.gemm0_ms + c.gemm1_ms;
  c.warmup = gemm > 20 ? std::min(o.warmup, 1) : o.warmup;
  const double runs = c.warmup + o.reps;

  double ms = 0;  // one run of every measurement
  const bool cublas = o.has_system("cublas"), comet = o.has_system("comet");
  const bool seq = o.has_system("sequential"), chunked = o.has_system("chunked");
  const bool fwd = o.has_layer("fwd");
  // The backward's launches are timed like the forward's layers of their kind (l2 pulls like l0, l3
  // combines like l1; their GEMMs are as large or smaller): counted as one more of each.
  const int l0 = o.has_layer("l0") + o.has_layer("l2"), l1 = o.has_layer("l1") + o.has_layer("l3");
  auto fused = [&](double g, int n) {  // n 0: the sequential mode, a pull on every block then the GEMM
    if (n == 0) return g + comm_ms(bytes, link, kResidentBlocks);
    return std::max(g * kResidentBlocks / double(kResidentBlocks - n), comm_ms(bytes, link, n));
  };
  if (cublas || seq || chunked) ms += 2 * ((l0 ? c.gemm0_ms : 0) + (l1 ? c.gemm1_ms : 0));  // both cuBLAS paths
  double best0 = 1e30, best1 = 1e30;
  for (int n : o.n_comm) {
    best0 = std::min(best0, fused(c.gemm0_ms, n));
    best1 = std::min(best1, fused(c.gemm1_ms, n));
  }
  if (comet) {
    for (int n : o.n_comm) ms += l0 * fused(c.gemm0_ms, n) + l1 * fused(c.gemm1_ms, n);
    ms += l0 * c.gemm0_ms + l1 * c.gemm1_ms;
    const int comm_runs = o.comm_all ? int(o.n_comm.size()) : 1;
    ms += comm_runs * (l0 + l1) * comm_ms(bytes, link, 2);
    if (fwd) ms += best0 + best1;
  }
  const double seq0 = c.comm0_ms + c.gemm0_ms + 0.1, seq1 = c.comm1_ms + c.gemm1_ms;
  if (seq) ms += (l0 ? seq0 : 0) + (l1 ? seq1 : 0) + (fwd ? seq0 + seq1 + 0.2 : 0);
  if (o.paired && comet && seq)  // the tuned run and the baseline of each layer once more, in rotation
    ms += (l0 ? best0 + seq0 : 0) + (l1 ? best1 + seq1 : 0) + (fwd ? best0 + best1 + seq0 + seq1 + 0.2 : 0);
  if (chunked) {
    std::set<int> used;
    for (int ch : o.chunks) used.insert(std::min(ch, par.world() - 1));
    const double c0 = std::max(c.gemm0_ms, comm_ms(bytes, link, o.chunk_comm_blocks)) * 1.2;
    const double c1 = std::max(c.gemm1_ms, comm_ms(bytes, link, o.chunk_comm_blocks)) * 1.2;
    ms += used.size() * ((l0 ? c0 : 0) + (l1 ? c1 : 0)) + (fwd ? c0 + c1 : 0);
  }
  // The backward (bench/README.md): every repeat re-runs a forward first. Its four GEMMs are twice the
  // forward's FLOPs; its communication is the forward's (a pull and a combine).
  const bool bwd = o.has_layer("bwd"), pair = o.has_layer("fwd+bwd");
  int bwd_measurements = 0;
  if (bwd || pair) {
    const double back = 2 * gemm + c.comm0_ms + c.comm1_ms;
    const int passes = (bwd ? 1 : 0) + (pair ? 1 : 0);
    if (comet) {
      ms += passes * (best0 + best1 + back) + best0 + best1 + back;  // + the weight gradients alone
      bwd_measurements += passes + 1;
    }
    if (seq) {
      ms += (1 + passes) * (seq0 + seq1 + back + 0.2) + 2 * gemm;  // a pass, the timed ones, both paths
      bwd_measurements += passes + 4;
    }
    if (cublas) {
      ms += gemm;  // the weight-gradient GEMMs alone
      bwd_measurements += 1;
    }
  }
  int measurements = bwd_measurements;
  const int layers = l0 + l1;
  if (cublas || seq || chunked) measurements += 2 * layers;
  if (comet) measurements += layers * (int(o.n_comm.size()) + 2) + (fwd ? 1 : 0);
  if (seq) measurements += layers + (fwd ? 1 : 0);
  if (chunked) measurements += layers * int(o.chunks.size()) + (fwd ? 1 : 0);
  c.seconds = (ms + measurements * kPerRepOverheadMs) * runs * 1e-3 + 0.1;  // + data and staging
  return c;
}

double estimate_group_setup_seconds(const MemoryNeed& need, const MoeShape& shape, const Parallel& par) {
  (void)shape;
  (void)par;
  // cudaHostAlloc + clearing of pinned memory: ~2.5 GB/s; device allocations and clears: fast.
  return 0.5 + need.host_pinned_bytes / 2.5e9 + need.device_bytes / 200e9;
}

}  // namespace comet::bench
