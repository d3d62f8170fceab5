#include "reference/expert_math.hpp"

#include "reference/activation.hpp"
#include "reference/checks.hpp"
#include "reference/parallel_for.hpp"

namespace comet::reference::detail {

// Enough rows per thread that a thread's start-up is small beside its dot products.
constexpr int kMinRowsPerThread = 16;

template <class T>
T dot(const T* a, const T* b, int n) {
  // Independent partial sums let the compiler vectorise without reassociating (no -ffast-math).
  T acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  T tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

template <class T>
void pre_activation(const MoeShape& shape, const ExpertView<T>& w, const std::vector<const T*>& x_rows, int fb,
                    int fe, T* z) {
  const int H = shape.hidden, fs = fe - fb, nz = pre_activation_width(shape.act, fs);
  const int rows = int(x_rows.size());
  // Weight row outer: each w0 row is read once and stays in L1 while it meets every token row.
  parallel_for(nz, kMinRowsPerThread, [&](int n0, int n1) {
    for (int n = n0; n < n1; ++n) {
      const T* w0_row = w.w0 + size_t(w0_row_of_shard_column(shape, fb, fs, n)) * H;
      for (int m = 0; m < rows; ++m) z[size_t(m) * nz + n] = dot(w0_row, x_rows[m], H);
    }
  });
}

template <class T>
void expert_rows_output(const MoeShape& shape, const ExpertView<T>& w, const T* hid, int rows, int fb, int fe,
                        T* y) {
  const int H = shape.hidden, F = shape.ffn, fs = fe - fb;
  parallel_for(H, kMinRowsPerThread, [&](int h0, int h1) {
    for (int h = h0; h < h1; ++h) {
      const T* w1_row = w.w1 + size_t(h) * F + fb;
      for (int m = 0; m < rows; ++m) y[size_t(m) * H + h] = dot(w1_row, hid + size_t(m) * fs, fs);
    }
  });
}

}  // namespace comet::reference::detail

namespace comet::reference {

template <class T>
std::vector<T> expert_hidden(const MoeShape& shape, const ExpertWeights<T>& weights, int expert, const T* x,
                             int f_begin, int f_end) {
  detail::check_weights(shape, weights);
  detail::check_expert_shard(shape, expert, f_begin, f_end);
  COMET_REQUIRE(x != nullptr, "reference::expert_hidden: x is null");
  const int fs = f_end - f_begin;
  std::vector<T> z(detail::pre_activation_width(shape.act, fs)), h(fs);
  detail::pre_activation(shape, detail::expert_view(shape, weights, expert), {x}, f_begin, f_end, z.data());
  detail::activate(shape.act, z.data(), fs, h.data());
  return h;
}

template <class T>
std::vector<T> expert_output(const MoeShape& shape, const ExpertWeights<T>& weights, int expert,
                             const T* hidden_shard, int f_begin, int f_end) {
  detail::check_weights(shape, weights);
  detail::check_expert_shard(shape, expert, f_begin, f_end);
  COMET_REQUIRE(hidden_shard != nullptr, "reference::expert_output: hidden_shard is null");
  std::vector<T> y(shape.hidden);
  detail::expert_rows_output(shape, detail::expert_view(shape, weights, expert), hidden_shard, 1, f_begin, f_end,
                             y.data());
  return y;
}

#define COMET_INSTANTIATE(T)                                                                                     \
  template T detail::dot<T>(const T*, const T*, int);                                                            \
  template void detail::pre_activation<T>(const MoeShape&, const detail::ExpertView<T>&,                        \
                                          const std::vector<const T*>&, int, int, T*);                           \
  template void detail::expert_rows_output<T>(const MoeShape&, const detail::ExpertView<T>&, const T*, int, int, \
                                              int, T*);                                                          \
  template std::vector<T> expert_hidden<T>(const MoeShape&, const ExpertWeights<T>&, int, const T*, int, int);   \
  template std::vector<T> expert_output<T>(const MoeShape&, const ExpertWeights<T>&, int, const T*, int, int);
COMET_INSTANTIATE(float)
COMET_INSTANTIATE(double)
#undef COMET_INSTANTIATE

}  // namespace comet::reference
