// The IpcTeam's device barrier (internal to src/team).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "comet/team.hpp"

namespace comet::team_detail {

// Enqueues on `stream` a one-block kernel that bumps `epoch` (this rank's device-resident barrier
// counter), writes it into word [rank] of every peer's barrier area (signal area + barrier_offset) and
// waits, bounded, until every word of its own barrier area has reached it.
// `signal_areas` is the device table of the W peers' signal areas as this rank addresses them.
void launch_ipc_barrier(cudaStream_t stream, uint64_t* epoch, uint64_t* const* signal_areas, int barrier_offset,
                        const TeamDeviceView& team);

}  // namespace comet::team_detail
