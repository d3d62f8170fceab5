// The fused layer's IpcTeam check (built when the fused kernels are).
#pragma once

#include <string>

#include "comet/team.hpp"

namespace comet::ipc_test {
// Empty on success, else what failed.
std::string check_fused_layer(IpcTeam& team);
}  // namespace comet::ipc_test
