// forward() and forward_distributed(): both are sums of "partial outputs" (a set of experts on an
// F-shard), so the distributed cross-check exercises exactly the EP x TP partition of the same math.
#include <algorithm>

#include "reference/activation.hpp"
#include "reference/expert_math.hpp"
#include "reference/routed_rows.hpp"

namespace comet::reference {

namespace {

// For every rank s and token t: sum over slots j (in order) whose expert lies in [e_begin, e_end) of
// gates[t][j] * (w1_e[:, fb:fe] act(w0_e x)[fb:fe]). Slots of other experts contribute nothing.
template <class T>
RankOutputs<T> partial_outputs(const MoeShape& shape, const ExpertWeights<T>& weights,
                               const std::vector<RankInput<T>>& ranks,
                               const std::vector<std::vector<detail::RoutedRow>>& rows_by_expert, int e_begin,
                               int e_end, int fb, int fe) {
  const int H = shape.hidden, k = shape.topk, fs = fe - fb;
  const int nz = detail::pre_activation_width(shape.act, fs);

  // y of every routed (token, slot), kept per slot so that the combine below sums in slot order.
  RankOutputs<T> y_slots(ranks.size());
  for (size_t s = 0; s < ranks.size(); ++s) y_slots[s].assign(size_t(ranks[s].tokens) * k * H, T(0));

  for (int e = e_begin; e < e_end; ++e) {
    const auto& rows = rows_by_expert[e];
    if (rows.empty()) continue;
    const int M = int(rows.size());
    const auto w = detail::expert_view(shape, weights, e);
    std::vector<T> z(size_t(M) * nz), hid(size_t(M) * fs), y(size_t(M) * H);
    detail::pre_activation(shape, w, detail::x_rows_of(shape, ranks, rows), fb, fe, z.data());
    for (int m = 0; m < M; ++m) detail::activate(shape.act, &z[size_t(m) * nz], fs, &hid[size_t(m) * fs]);
    detail::expert_rows_output(shape, w, hid.data(), M, fb, fe, y.data());
    for (int m = 0; m < M; ++m) {
      const auto& r = rows[m];
      std::copy_n(&y[size_t(m) * H], H, &y_slots[r.rank][(size_t(r.token) * k + r.slot) * H]);
    }
  }

  RankOutputs<T> out(ranks.size());
  for (size_t s = 0; s < ranks.size(); ++s) {
    out[s].assign(size_t(ranks[s].tokens) * H, T(0));
    for (int t = 0; t < ranks[s].tokens; ++t) {
      T* o = &out[s][size_t(t) * H];
      for (int j = 0; j < k; ++j) {
        const int e = ranks[s].ids[size_t(t) * k + j];
        if (e < e_begin || e >= e_end) continue;
        const T g = ranks[s].gates[size_t(t) * k + j];
        const T* y = &y_slots[s][(size_t(t) * k + j) * H];
        for (int h = 0; h < H; ++h) o[h] += g * y[h];
      }
    }
  }
  return out;
}

}  // namespace

template <class T>
RankOutputs<T> forward(const MoeShape& shape, const Parallel& par, const ExpertWeights<T>& weights,
                       const std::vector<RankInput<T>>& ranks) {
  check_inputs(shape, par, weights, ranks);
  return partial_outputs(shape, weights, ranks, detail::rows_by_expert(shape, ranks), 0, shape.num_experts, 0,
                         shape.ffn);
}

template <class T>
RankOutputs<T> forward_distributed(const MoeShape& shape, const Parallel& par, const ExpertWeights<T>& weights,
                                   const std::vector<RankInput<T>>& ranks) {
  check_inputs(shape, par, weights, ranks);
  const auto rows = detail::rows_by_expert(shape, ranks);
  const int El = par.local_experts(shape), Fs = par.ffn_shard(shape);
  RankOutputs<T> out(ranks.size());
  for (size_t s = 0; s < ranks.size(); ++s) out[s].assign(size_t(ranks[s].tokens) * shape.hidden, T(0));
  for (int q = 0; q < par.world(); ++q) {
    const int e0 = par.first_local_expert(shape, q), f0 = par.tp_index(q) * Fs;
    const RankOutputs<T> part = partial_outputs(shape, weights, ranks, rows, e0, e0 + El, f0, f0 + Fs);
    for (size_t s = 0; s < ranks.size(); ++s)
      for (size_t i = 0; i < out[s].size(); ++i) out[s][i] += part[s][i];
  }
  return out;
}

#define COMET_INSTANTIATE(T)                                                                                 \
  template RankOutputs<T> forward<T>(const MoeShape&, const Parallel&, const ExpertWeights<T>&,              \
                                     const std::vector<RankInput<T>>&);                                      \
  template RankOutputs<T> forward_distributed<T>(const MoeShape&, const Parallel&, const ExpertWeights<T>&, \
                                                 const std::vector<RankInput<T>>&);
COMET_INSTANTIATE(float)
COMET_INSTANTIATE(double)
#undef COMET_INSTANTIATE

}  // namespace comet::reference
