// A schedule the probe tries before the library compiles it (comet-probe-grouped-gemm's variant
// coop160x2_n): the cooperative 128 x 160 grouped GEMM in 1 x 2 clusters, whose two blocks compute two
// column blocks of one M-tile and share its A tile by TMA multicast. Where an expert's columns are few
// and its rows many (a TP 8 shard's launch 2, N = F / 8), A is the operand that streams, and the 2 x 1
// clusters of the library's schedule share B instead. W_e [k][n] only (launch 2's layout).
#include "grouped_gemm_probe_multicast.hpp"
#include "kernels/expert_gemm_grouped.cuh"

namespace comet::bench {

namespace {
struct Cooperative160MulticastA {
  using TileShape = cute::Shape<cute::_128, cute::_160, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
}  // namespace

void launch_160_multicast_a(const kernels::ExpertGemmLaunch& l, cudaStream_t stream) {
  COMET_REQUIRE(l.w_kn, "the 1 x 2-cluster probe schedule is compiled for W_e [k][n] only");
  kernels::expert_grouped::launch<kernels::expert_grouped::Row, Cooperative160MulticastA>(l, stream);
}

size_t workspace_160_multicast_a(int experts) {
  return kernels::grouped::max_workspace_bytes<
      kernels::expert_grouped::ExpertGemm<kernels::expert_grouped::Row, Cooperative160MulticastA>>(experts);
}

}  // namespace comet::bench
