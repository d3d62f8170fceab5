// Device-side memory ordering and bounded waits, shared by the Team's signal/barrier kernels and the
// fused kernels' tile flags. Every wait is bounded: on timeout the first failing waiter of a rank
// records (rank, site, index, expected, seen) in the rank's DeviceStatus and raises its abort word, so
// that every other waiter of that rank gives up too and the kernel ends instead of hanging.
#pragma once

#include <cstdint>

#include "comet/team.hpp"
#include "ptx/memory_order.cuh"

namespace comet::dev {

// ---- failure reporting ---------------------------------------------------------------------------
__device__ __forceinline__ bool aborted(const TeamDeviceView& team) {
  return *reinterpret_cast<volatile int32_t*>(&team.status->abort) != 0;
}

__device__ inline void report_timeout(const TeamDeviceView& team, WaitSite site, int index, int64_t expected,
                                      int64_t seen) {
  DeviceStatus* s = team.status;
  if (atomicCAS(&s->code, 0, 1) == 0) {
    s->rank = team.rank;
    s->site = static_cast<int32_t>(site);
    s->index = index;
    s->expected = expected;
    s->seen = seen;
    __threadfence_system();
  }
  atomicExch(&s->abort, 1);
}

// ---- bounded waits -------------------------------------------------------------------------------
// Spins until load() >= value. Returns false (after reporting) on timeout, or at once when another
// waiter of this rank already failed. The clock and the abort word are read only every 64 polls.
template <class Load, class T>
__device__ inline bool wait_until_ge(Load load, T value, const TeamDeviceView& team, WaitSite site, int index) {
  T seen = load();
  if (seen >= value) return true;
  const uint64_t start = global_timer_ns();
  for (uint32_t polls = 1;; ++polls) {
    seen = load();
    if (seen >= value) return true;
    if ((polls & 63) == 0) {
      if (aborted(team)) return false;
      if (global_timer_ns() - start > team.timeout_ns) {
        report_timeout(team, site, index, static_cast<int64_t>(value), static_cast<int64_t>(seen));
        return false;
      }
    }
    __nanosleep(32);
  }
}

__device__ inline bool wait_flag_gpu(const int32_t* flag, int32_t value, const TeamDeviceView& team, WaitSite site,
                                     int index) {
  return wait_until_ge([flag] { return ld_acquire_gpu(flag); }, value, team, site, index);
}

__device__ inline bool wait_flag_gpu(const uint64_t* flag, uint64_t value, const TeamDeviceView& team, WaitSite site,
                                     int index) {
  return wait_until_ge([flag] { return ld_acquire_gpu(flag); }, value, team, site, index);
}

__device__ inline bool wait_signal_sys(const uint64_t* word, uint64_t value, const TeamDeviceView& team,
                                       WaitSite site, int index) {
  return wait_until_ge([word] { return ld_acquire_sys(word); }, value, team, site, index);
}

}  // namespace comet::dev
