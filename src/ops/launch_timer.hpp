// The CUDA half of MoeOptions::check_schedule (tune/schedule_check.hpp): a rank's timed launches, an
// event pair each, read back without waiting. Before each checked launch the engine polls the pairs
// whose end has passed (cudaEventQuery: no synchronisation) and hands their times to the check; a pair
// still in flight is read at a later call. Never used while the stream is being captured into a CUDA
// graph (an event query is not allowed there, and a replay would not re-time anything).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "tune/schedule_check.hpp"

namespace comet {

class LaunchTimer {
 public:
  LaunchTimer() = default;
  LaunchTimer(const LaunchTimer&) = delete;
  LaunchTimer& operator=(const LaunchTimer&) = delete;
  ~LaunchTimer();

  // Records the start of a timed launch of `key` / `arm` on `stream`: the slot to end it with, or -1
  // when all slots hold launches whose times are not in yet (that launch then goes untimed).
  int begin(const ScheduleCheckKey& key, ScheduleArm arm, cudaStream_t stream);
  // Records its end (after the launch's last kernel on `stream`). noexcept: a failed record drops the
  // sample (ScheduleCheck::drop via the next poll).
  void end(int slot, cudaStream_t stream) noexcept;
  // A launch that threw between begin and end: its slot is free again and its sample dropped.
  void abandon(int slot, ScheduleCheck& check) noexcept;
  // Every ended launch whose end event has completed: its time into `check`, its slot freed.
  void poll(ScheduleCheck& check);

  // Timed launches in flight per rank. A host that runs ahead of the GPU can have every timed launch of
  // the four launches' checks in flight at once (4 x 2 x 5); 16 starved a benchmark loop without
  // synchronisation on the H100 (its later launches went untimed and were owed again).
  static constexpr int kSlots = 64;

 private:
  struct Slot {
    cudaEvent_t start = nullptr, stop = nullptr;
    ScheduleCheckKey key;
    ScheduleArm arm = ScheduleArm::pick;
    enum class State { free, started, ended, failed } state = State::free;
  };
  std::vector<Slot> slots_;
};

// Ends a timed launch when it leaves scope: its end event if the launch was issued, else (an exception
// on the way) its slot abandoned.
class TimedLaunch {
 public:
  TimedLaunch() = default;
  TimedLaunch(const TimedLaunch&) = delete;
  TimedLaunch& operator=(const TimedLaunch&) = delete;
  ~TimedLaunch();
  void start(LaunchTimer& timer, ScheduleCheck& check, const ScheduleCheckKey& key, ScheduleArm arm,
             cudaStream_t stream);

 private:
  LaunchTimer* timer_ = nullptr;
  ScheduleCheck* check_ = nullptr;
  int slot_ = -1;
  cudaStream_t stream_ = nullptr;
  int exceptions_ = 0;
};

}  // namespace comet
