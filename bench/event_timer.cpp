#include "event_timer.hpp"

#include <algorithm>

#include "comet/cuda_check.hpp"
#include "device_fill.hpp"

namespace comet::bench {
namespace {
constexpr double kSpinMicroseconds = 30;  // longer than the host needs to enqueue a layer's first launch
}

EventTimer::EventTimer(int max_reps) : start_(max_reps, nullptr), stop_(max_reps, nullptr) {
  for (int i = 0; i < max_reps; ++i) {
    COMET_CUDA_CHECK(cudaEventCreate(&start_[i]));
    COMET_CUDA_CHECK(cudaEventCreate(&stop_[i]));
  }
}

EventTimer::~EventTimer() {
  for (size_t i = 0; i < start_.size(); ++i) {
    if (start_[i]) cudaEventDestroy(start_[i]);
    if (stop_[i]) cudaEventDestroy(stop_[i]);
  }
}

Timing EventTimer::measure(cudaStream_t stream, int warmup, int reps, const std::function<void()>& pre,
                           const std::function<void()>& fn, const std::function<void()>& check) {
  COMET_REQUIRE(reps >= 1 && reps <= int(start_.size()), "EventTimer: reps must be in [1, ", start_.size(), "]");
  for (int i = 0; i < warmup; ++i) {
    if (pre) pre();
    fn();
  }
  for (int i = 0; i < reps; ++i) {
    if (pre) pre();
    gpu_spin(kSpinMicroseconds, stream);
    COMET_CUDA_CHECK(cudaEventRecord(start_[i], stream));
    fn();
    COMET_CUDA_CHECK(cudaEventRecord(stop_[i], stream));
  }
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (check) check();
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    float t = 0;
    COMET_CUDA_CHECK(cudaEventElapsedTime(&t, start_[i], stop_[i]));
    ms[i] = t;
  }
  std::sort(ms.begin(), ms.end());
  Timing r;
  r.samples = reps;
  r.min_ms = ms.front();
  r.max_ms = ms.back();
  r.median_ms = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
  return r;
}

}  // namespace comet::bench
