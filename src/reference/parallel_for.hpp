// Splits [0, n) into contiguous chunks run on std::threads (OpenMP is not assumed).
// Callers give every index its own outputs and a fixed summation order, so results do not depend on
// how many threads run.
#pragma once

#include <algorithm>
#include <thread>
#include <vector>

namespace comet::reference::detail {

// fn(begin, end) is called on disjoint chunks covering [0, n). Chunks smaller than min_chunk are
// not worth a thread; the calling thread runs the first chunk itself.
template <class Fn>
void parallel_for(int n, int min_chunk, Fn&& fn) {
  if (n <= 0) return;
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  const int threads = std::clamp(n / std::max(1, min_chunk), 1, hw);
  if (threads == 1) {
    fn(0, n);
    return;
  }
  const int chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int b = chunk; b < n; b += chunk) pool.emplace_back([&fn, b, e = std::min(n, b + chunk)] { fn(b, e); });
  fn(0, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

}  // namespace comet::reference::detail
