// Dense pieces of one expert applied to a batch of M token rows (the rows routed to it), on an
// F-shard [fb, fe) of width fs = fe - fb. Shared by forward, the distributed cross-check, backward and
// the single-token helpers, so that there is one implementation of the math.
#pragma once

#include <vector>

#include "comet/reference.hpp"

namespace comet::reference::detail {

// Expert e's weights as raw pointers: w0_e [w0_rows][H], w1_e [H][F].
template <class T>
struct ExpertView {
  const T* w0;
  const T* w1;
};

template <class T>
ExpertView<T> expert_view(const MoeShape& shape, const ExpertWeights<T>& w, int e) {
  return {w.w0.data() + size_t(e) * shape.w0_rows() * shape.hidden,
          w.w1.data() + size_t(e) * shape.hidden * shape.ffn};
}

// Row of the full w0_e that the shard's pre-activation column n (see pre_activation_width) reads.
inline int w0_row_of_shard_column(const MoeShape& shape, int fb, int fs, int n) {
  return n < fs ? fb + n : shape.ffn + fb + (n - fs);
}

// z[m][n] = <w0_e row, x_rows[m]> for the shard's pre-activation columns; z is [M][nz].
template <class T>
void pre_activation(const MoeShape& shape, const ExpertView<T>& w, const std::vector<const T*>& x_rows, int fb,
                    int fe, T* z);

// y[m][h] = sum_{f in [fb, fe)} w1_e[h][f] * hid[m][f - fb]; hid is [M][fs], y is [M][H].
template <class T>
void expert_rows_output(const MoeShape& shape, const ExpertView<T>& w, const T* hid, int rows, int fb, int fe, T* y);

// Sum of a[i] * b[i], i < n, in a fixed order (eight interleaved partial sums, then the tail).
template <class T>
T dot(const T* a, const T* b, int n);

}  // namespace comet::reference::detail
