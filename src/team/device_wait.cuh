// Device-side memory ordering and bounded waits, shared by the Team's signal/barrier kernels and the
// fused kernels' tile flags. Every wait is bounded: on timeout the first failing waiter of a rank
// records (rank, site, index, expected, seen) in the rank's DeviceStatus and raises its abort word, so
// that every other waiter of that rank gives up too and the kernel ends instead of hanging.
#pragma once

#include <cstdint>

#include "comet/team.hpp"

namespace comet::dev {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- loads and stores with explicit ordering ---------------------------------------------------
// gpu scope: producer and consumer are blocks of the same GPU (tile flags of one kernel).
// sys scope: the other side may be another process or GPU (team signals).
__device__ __forceinline__ int32_t ld_acquire_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int32_t* p, int32_t v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ int32_t atomic_add_release_gpu(int32_t* p, int32_t v) {
  int32_t old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// Orders this thread's earlier generic-proxy global writes before later async-proxy (TMA, bulk copy)
// accesses, and vice versa. Needed where data written one way is read the other way.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

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

__device__ inline bool wait_signal_sys(const uint64_t* word, uint64_t value, const TeamDeviceView& team,
                                       WaitSite site, int index) {
  return wait_until_ge([word] { return ld_acquire_sys(word); }, value, team, site, index);
}

}  // namespace comet::dev
