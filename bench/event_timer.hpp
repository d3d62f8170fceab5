// Median-of-repeats timing with CUDA events on one stream. Each repeat: pre() (untimed: a new epoch,
// a re-prepare), a short GPU spin, the start event, fn(), the stop event. Repeats are enqueued back to
// back and read once at the end, so the host stays ahead of the GPU and launch latency never lands
// inside a timed region; a fn that synchronises inside (the sequential baseline's count read) is timed
// with that synchronisation, which is part of its cost.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace comet::bench {

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
  int samples = 0;
};

// One call of a rotation: pre() untimed, fn() timed.
struct TimedCall {
  std::function<void()> pre, fn;
};

class EventTimer {
 public:
  explicit EventTimer(int max_reps);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  // Events are recorded on `stream`; fn must leave all its work ordered before a later record there.
  // `check` runs after the repeats (synchronise and raise device-reported errors).
  Timing measure(cudaStream_t stream, int warmup, int reps, const std::function<void()>& pre,
                 const std::function<void()>& fn, const std::function<void()>& check);
  // The calls in rotation: `reps` rounds, each running every call once, round r starting at call
  // r % calls.size(), so that whatever state the GPU drifts through (clocks, power) every call sees it
  // alike. One Timing per call.
  std::vector<Timing> measure_rotation(cudaStream_t stream, int warmup, int reps, const std::vector<TimedCall>& calls,
                                       const std::function<void()>& check);

 private:
  std::vector<cudaEvent_t> start_, stop_;
};

}  // namespace comet::bench
