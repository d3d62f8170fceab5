// The fused layer's IpcTeam check (built when the fused kernels are).
#pragma once

#include <functional>
#include <string>

#include "comet/team.hpp"

namespace comet::ipc_test {
// Empty on success, else what failed.
std::string check_fused_layer(IpcTeam& team);
// A peer that never comes to a forward, or dies in one (`killed`): the others time out with a precise
// error within a bound, their outputs are NaN, and the teardown (IpcTeam::close) ends either way.
// host_barrier: a barrier over the processes outside the GPU (the rendezvous').
std::string check_dead_peer(IpcTeam& team, bool killed, const std::function<void()>& host_barrier);
}  // namespace comet::ipc_test
