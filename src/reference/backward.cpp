// backward(): gradients of L = sum_s <dout_s, out_s>, expert by expert over the rows routed to it.
// Per routed row (token x, slot j, expert e, gate g), with z = w0_e x, h = act(z), y = w1_e h:
//   dgate = <dout, y>;  dy = g dout;  dW1_e += dy h^T;  dh = W1_e^T dy;  dz = act'(z) . dh;
//   dW0_e += dz x^T;  dx += W0_e^T dz.
#include <algorithm>

#include "reference/activation.hpp"
#include "reference/checks.hpp"
#include "reference/expert_math.hpp"
#include "reference/parallel_for.hpp"
#include "reference/routed_rows.hpp"

namespace comet::reference {

namespace {

constexpr int kMinChunk = 16;

// out[i][:] += sum_m coef[m][i] * v[m][:] for i in [0, n_out), out [n_out][len], coef [M][n_out],
// v [M][len]. Serves both weight gradients: dW1 (i = h, coef = dy, v = hid), dW0 (i = n, coef = dz, v = x).
template <class T>
void add_outer_products(int n_out, int len, const T* coef, const std::vector<const T*>& v, T* out) {
  const int M = int(v.size());
  detail::parallel_for(n_out, kMinChunk, [&](int i0, int i1) {
    for (int i = i0; i < i1; ++i) {
      T* o = out + size_t(i) * len;
      for (int m = 0; m < M; ++m) {
        const T c = coef[size_t(m) * n_out + i];
        const T* vm = v[m];
        for (int l = 0; l < len; ++l) o[l] += c * vm[l];
      }
    }
  });
}

// r[m][:] = sum_i a[m][i] * b[i][:] (r = a b) with a [M][n_in], b [n_in][len], r [M][len]; the
// transposed-weight products dh = dy W1_e and dx = dz W0_e. Each thread owns a column range of r.
template <class T>
void matmul_rows(int M, int n_in, int len, const T* a, const T* b, T* r) {
  std::fill_n(r, size_t(M) * len, T(0));
  detail::parallel_for(len, kMinChunk, [&](int c0, int c1) {
    for (int i = 0; i < n_in; ++i) {
      const T* bi = b + size_t(i) * len;
      for (int m = 0; m < M; ++m) {
        const T ai = a[size_t(m) * n_in + i];
        T* rm = r + size_t(m) * len;
        for (int c = c0; c < c1; ++c) rm[c] += ai * bi[c];
      }
    }
  });
}

}  // namespace

template <class T>
Gradients<T> backward(const MoeShape& shape, const Parallel& par, const ExpertWeights<T>& weights,
                      const std::vector<RankInput<T>>& ranks, const RankOutputs<T>& dout) {
  check_inputs(shape, par, weights, ranks);
  detail::check_dout(shape, ranks, dout);
  const int H = shape.hidden, F = shape.ffn, k = shape.topk, R = shape.w0_rows();

  Gradients<T> grad;
  grad.dx.resize(ranks.size());
  grad.dgates.resize(ranks.size());
  for (size_t s = 0; s < ranks.size(); ++s) {
    grad.dx[s].assign(size_t(ranks[s].tokens) * H, T(0));
    grad.dgates[s].assign(size_t(ranks[s].tokens) * k, T(0));
  }
  grad.dw0.assign(weights.w0.size(), T(0));
  grad.dw1.assign(weights.w1.size(), T(0));

  const auto rows_by_expert = detail::rows_by_expert(shape, ranks);
  for (int e = 0; e < shape.num_experts; ++e) {
    const auto& rows = rows_by_expert[e];
    if (rows.empty()) continue;
    const int M = int(rows.size());
    const auto w = detail::expert_view(shape, weights, e);
    const auto x = detail::x_rows_of(shape, ranks, rows);

    // Forward again for this expert. On the whole of F, pre-activation column n is w0_e row n.
    std::vector<T> z(size_t(M) * R), hid(size_t(M) * F), y(size_t(M) * H);
    detail::pre_activation(shape, w, x, 0, F, z.data());
    for (int m = 0; m < M; ++m) detail::activate(shape.act, &z[size_t(m) * R], F, &hid[size_t(m) * F]);
    detail::expert_rows_output(shape, w, hid.data(), M, 0, F, y.data());

    std::vector<T> dy(size_t(M) * H);
    for (int m = 0; m < M; ++m) {
      const auto& r = rows[m];
      const T* d = &dout[r.rank][size_t(r.token) * H];
      grad.dgates[r.rank][size_t(r.token) * k + r.slot] = detail::dot(d, &y[size_t(m) * H], H);
      const T g = ranks[r.rank].gates[size_t(r.token) * k + r.slot];
      for (int h = 0; h < H; ++h) dy[size_t(m) * H + h] = g * d[h];
    }

    std::vector<const T*> hid_rows(M);
    for (int m = 0; m < M; ++m) hid_rows[m] = &hid[size_t(m) * F];
    add_outer_products(H, F, dy.data(), hid_rows, grad.dw1.data() + size_t(e) * H * F);

    std::vector<T> dh(size_t(M) * F), dz(size_t(M) * R);
    matmul_rows(M, H, F, dy.data(), w.w1, dh.data());
    for (int m = 0; m < M; ++m)
      detail::activate_backward(shape.act, &z[size_t(m) * R], &dh[size_t(m) * F], F, &dz[size_t(m) * R]);

    add_outer_products(R, H, dz.data(), x, grad.dw0.data() + size_t(e) * R * H);

    std::vector<T> dx_rows(size_t(M) * H);
    matmul_rows(M, R, H, dz.data(), w.w0, dx_rows.data());
    for (int m = 0; m < M; ++m) {
      T* dx = &grad.dx[rows[m].rank][size_t(rows[m].token) * H];
      for (int h = 0; h < H; ++h) dx[h] += dx_rows[size_t(m) * H + h];
    }
  }
  return grad;
}

template Gradients<float> backward<float>(const MoeShape&, const Parallel&, const ExpertWeights<float>&,
                                          const std::vector<RankInput<float>>&, const RankOutputs<float>&);
template Gradients<double> backward<double>(const MoeShape&, const Parallel&, const ExpertWeights<double>&,
                                            const std::vector<RankInput<double>>&, const RankOutputs<double>&);

}  // namespace comet::reference
