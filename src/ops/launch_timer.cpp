// A rank's timed launches for the schedule check (launch_timer.hpp).
#include "ops/launch_timer.hpp"

#include <exception>

#include "comet/cuda_check.hpp"

namespace comet {

LaunchTimer::~LaunchTimer() {
  for (Slot& s : slots_) {
    if (s.start) cudaEventDestroy(s.start);
    if (s.stop) cudaEventDestroy(s.stop);
  }
}

int LaunchTimer::begin(const ScheduleCheckKey& key, ScheduleArm arm, cudaStream_t stream) {
  int slot = -1;
  for (size_t i = 0; i < slots_.size() && slot < 0; ++i)
    if (slots_[i].state == Slot::State::free) slot = int(i);
  if (slot < 0) {
    if (int(slots_.size()) >= kSlots) return -1;
    Slot s;  // events with timing (the default flags)
    COMET_CUDA_CHECK(cudaEventCreate(&s.start));
    if (const cudaError_t e = cudaEventCreate(&s.stop); e != cudaSuccess) {
      cudaEventDestroy(s.start);
      COMET_CUDA_CHECK(e);
    }
    slots_.push_back(s);
    slot = int(slots_.size()) - 1;
  }
  Slot& s = slots_[slot];
  COMET_CUDA_CHECK(cudaEventRecord(s.start, stream));
  s.key = key;
  s.arm = arm;
  s.state = Slot::State::started;
  return slot;
}

void LaunchTimer::end(int slot, cudaStream_t stream) noexcept {
  Slot& s = slots_[slot];
  s.state = cudaEventRecord(s.stop, stream) == cudaSuccess ? Slot::State::ended : Slot::State::failed;
}

void LaunchTimer::abandon(int slot, ScheduleCheck& check) noexcept {
  Slot& s = slots_[slot];
  check.drop(s.key, s.arm);
  s.state = Slot::State::free;
}

void LaunchTimer::poll(ScheduleCheck& check) {
  for (Slot& s : slots_) {
    if (s.state == Slot::State::failed) {
      check.drop(s.key, s.arm);
      s.state = Slot::State::free;
    }
    if (s.state != Slot::State::ended) continue;
    // Not ready: a later call reads it. Any other answer (an earlier launch's fault that the query
    // reports) is left to the engine's own error path; the sample is dropped.
    const cudaError_t q = cudaEventQuery(s.stop);
    if (q == cudaErrorNotReady) continue;
    float ms = 0.f;
    if (q == cudaSuccess && cudaEventElapsedTime(&ms, s.start, s.stop) == cudaSuccess) check.add(s.key, s.arm, ms);
    else check.drop(s.key, s.arm);
    s.state = Slot::State::free;
  }
}

TimedLaunch::~TimedLaunch() {
  if (!timer_) return;
  if (std::uncaught_exceptions() > exceptions_) timer_->abandon(slot_, *check_);
  else timer_->end(slot_, stream_);
}

void TimedLaunch::start(LaunchTimer& timer, ScheduleCheck& check, const ScheduleCheckKey& key, ScheduleArm arm,
                        cudaStream_t stream) {
  int slot = -1;
  try {
    slot = timer.begin(key, arm, stream);
  } catch (...) {
    check.drop(key, arm);
    throw;
  }
  if (slot < 0) {  // every slot busy: this launch goes untimed, its arm owes another
    check.drop(key, arm);
    return;
  }
  timer_ = &timer;
  check_ = &check;
  slot_ = slot;
  stream_ = stream;
  exceptions_ = std::uncaught_exceptions();
}

}  // namespace comet
