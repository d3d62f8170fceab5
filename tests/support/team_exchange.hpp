// The exchange that the Team tests run on every backend (LocalTeam in tests/gpu, IpcTeam in
// tests/ipc): every rank writes a pattern into its slice of every peer's symmetric buffer, signals the
// peer, the team barriers, and each rank checks every element it received.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "comet/team.hpp"

namespace comet::testing {

// What a pattern check found over the local ranks.
struct PatternCheck {
  unsigned long long mismatches = 0;  // elements that differ from the expected pattern
  std::string first;                  // where the first one was found (empty when none)
};

// Bytes of a buffer that holds one slice of `n_per_slice` uint32 words per source rank.
size_t pattern_buffer_bytes(int world, size_t n_per_slice);

// One round over every local rank of `team` (LocalTeam: all W; IpcTeam: its own rank):
//  1. rank s writes value(gen, s, d, i) into slice [s] of every peer d's buffer (one kernel per rank),
//     then sets signal (first_signal + s) of every peer d to `gen`;
//  2. team.barrier();
//  3. rank d waits (signal_wait) for signal (first_signal + s) >= gen for every s, then a kernel checks
//     all W slices of its own copy and counts mismatches on the device;
//  4. team.barrier(), so that no rank's next round overwrites a buffer still being checked;
//  5. team.synchronize() (throws TimeoutError on a stalled wait), and the counts come back.
// Signal values are generation counters: rounds with growing `gen` need no reset. gen >= 1.
PatternCheck exchange_round(Team& team, SymmetricId buf, size_t n_per_slice, uint32_t gen, int first_signal = 0);

// Checks every local rank's copy against round `gen` without communicating (gen 0: all zero, as a
// fresh allocation must be). Synchronises the team.
PatternCheck check_pattern(Team& team, SymmetricId buf, size_t n_per_slice, uint32_t gen);

}  // namespace comet::testing
