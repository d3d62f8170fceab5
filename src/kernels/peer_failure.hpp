// A failed call on one rank must fail the call on every rank. A rank whose own plan refused the batch
// (rows over its capacity: the one refusal that is per rank) or whose waits timed out ships no partial
// rows, so its peers' receive slots would still hold its previous call's partials, and a peer's final
// reduce would sum them as if they were this call's. So, before the team barrier that ends the
// combine, a failed rank raises its word in every peer's failure area (publish_failure). After the
// barrier each rank's reduces read the words (CallFailure: any raised word makes the outputs NaN), then
// gather_peer_failures records the first failed peer in the rank's status (code 2, site peer_failed,
// kept until sync_and_check reads it, which names the peer) and clears the words: the next call is
// judged on its own.
//
// Ordering: rank s raises q's word[s] in call N only after the barrier that starts call N (staging),
// which q reaches only after it cleared call N-1's words; q reads call N's words after the barrier
// that ends call N's combine, which s reaches only after raising them.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "comet/team.hpp"
#include "kernels/local_rows.hpp"

namespace comet::kernels {

struct PublishFailureArgs {
  CallFailure failure;           // this rank's own failure (no peer words)
  // [W]: peer q's failure area [W] int32 as this rank addresses it (the transport's address: its own
  // symmetric address for NVSHMEM, kernels/transport.cuh)
  int32_t* const* peer_words;
  int rank = 0, world = 1;
};
// If this rank's call failed: peer_words[q][rank] = 1 for every peer q.
void publish_failure(const PublishFailureArgs& args, cudaStream_t stream);

struct GatherFailuresArgs {
  int32_t* words;        // this rank's failure area [W]
  TeamDeviceView team;   // where the first failed peer is recorded
};
// Records the first word peers raised in this call in the rank's status and clears them all (after
// the reduces that read them).
void gather_peer_failures(const GatherFailuresArgs& args, cudaStream_t stream);

}  // namespace comet::kernels
