// The fused layer's IpcTeam check (built when the fused kernels are).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comet/fused_moe.hpp"
#include "comet/team.hpp"
#include "harness/moe_problem.hpp"

namespace comet::ipc_test {

// This process's rank of a fused layer over the team: every process builds the same problem from the
// same seed and uploads its own tokens and weight shard (forced variants: tile 256, n_comm 2 / 3; an
// e4m3 layer: layer 0 on its 128 tile, W0 quantised on the GPU into w0_fp8).
struct IpcLayer {
  testing::MoeProblem problem;
  std::unique_ptr<FusedMoe> moe;
  std::unique_ptr<testing::DeviceRank> mine;
  testing::Fp8W0 w0_fp8;
};
IpcLayer make_ipc_layer(IpcTeam& team, const MoeShape& shape, const Parallel& par, const std::vector<int>& tokens,
                        testing::RoutingKind kind, uint64_t seed, DType dtype = DType::bf16);

// Empty on success, else what failed.
std::string check_fused_layer(IpcTeam& team);
// On a team without peer pointers (maps_peers() false: NVSHMEM across nodes): transport peer refused,
// and the cases of check_fused_layer with transport nvshmem (their DIGEST lines must equal CUDA IPC's),
// a peer's refusal and the fp8 layer 0 included.
std::string check_unmapped_fused_layer(IpcTeam& team);
// A peer that never comes to a forward, or dies in one (`killed`): the others time out with a precise
// error within a bound, their outputs are NaN, and the teardown (IpcTeam::close) ends either way.
// host_barrier: a barrier over the processes outside the GPU (the rendezvous').
std::string check_dead_peer(IpcTeam& team, bool killed, const std::function<void()>& host_barrier);
}  // namespace comet::ipc_test
