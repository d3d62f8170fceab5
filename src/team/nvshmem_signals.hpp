// An IpcTeam's signal words and barrier through NVSHMEM's signal operations, for a team on NVSHMEM's
// heap whose peers no pointer reaches (another node; or COMET_NVSHMEM_PEER_POINTERS=0, which hides
// them on one node to test this path). Internal to src/team. Built where NVSHMEM's headers are; the
// module's NVSHMEM device state is bound by bind() after NVSHMEM's initialisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "comet/team.hpp"

namespace comet::team_detail::nvshmem_signals {

// Whether this build has them (NVSHMEM's headers were found); without, every call below raises.
bool built();
// Binds this module's NVSHMEM device state (once per NVSHMEM initialisation).
void bind();
// Enqueues on `stream`: PE `pe`'s word at `word` (this PE's own symmetric address of it) = value.
void launch_set(cudaStream_t stream, uint64_t* word, uint64_t value, int pe);
// The barrier of barrier_body.cuh: this rank's epoch (device word), and its own barrier area (W words,
// symmetric), into whose word [rank] every PE's copy is signalled.
void launch_barrier(cudaStream_t stream, uint64_t* epoch, uint64_t* barrier_area, const TeamDeviceView& team);

}  // namespace comet::team_detail::nvshmem_signals
