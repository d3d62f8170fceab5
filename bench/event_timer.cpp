#include "event_timer.hpp"

#include <algorithm>

#include "comet/cuda_check.hpp"
#include "device_fill.hpp"

namespace comet::bench {
namespace {
constexpr double kSpinMicroseconds = 30;  // longer than the host needs to enqueue a layer's first launch

Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  Timing r;
  r.samples = int(n);
  r.min_ms = ms.front();
  r.max_ms = ms.back();
  r.median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return r;
}
}  // namespace

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
  return summarize(ms);
}

std::vector<Timing> EventTimer::measure_rotation(cudaStream_t stream, int warmup, int reps,
                                                 const std::vector<TimedCall>& calls,
                                                 const std::function<void()>& check) {
  const int n = int(calls.size());
  COMET_REQUIRE(n >= 1 && reps >= 1 && reps * n <= int(start_.size()), "EventTimer: reps x calls must be in [1, ",
                start_.size(), "], got ", reps, " x ", n);
  for (int i = 0; i < warmup; ++i) {
    for (const TimedCall& c : calls) {
      if (c.pre) c.pre();
      c.fn();
    }
  }
  for (int r = 0; r < reps; ++r) {
    for (int j = 0; j < n; ++j) {
      const int c = (r + j) % n;
      const int e = r * n + c;
      if (calls[c].pre) calls[c].pre();
      gpu_spin(kSpinMicroseconds, stream);
      COMET_CUDA_CHECK(cudaEventRecord(start_[e], stream));
      calls[c].fn();
      COMET_CUDA_CHECK(cudaEventRecord(stop_[e], stream));
    }
  }
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (check) check();
  std::vector<Timing> out;
  for (int c = 0; c < n; ++c) {
    std::vector<double> ms(reps);
    for (int r = 0; r < reps; ++r) {
      float t = 0;
      COMET_CUDA_CHECK(cudaEventElapsedTime(&t, start_[r * n + c], stop_[r * n + c]));
      ms[r] = t;
    }
    out.push_back(summarize(ms));
  }
  return out;
}

}  // namespace comet::bench
