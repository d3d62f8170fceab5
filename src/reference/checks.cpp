#include "reference/checks.hpp"

namespace comet::reference {

namespace detail {

template <class T>
void check_weights(const MoeShape& shape, const ExpertWeights<T>& weights) {
  validate(shape, Parallel{});
  const size_t E = size_t(shape.num_experts), H = size_t(shape.hidden), F = size_t(shape.ffn);
  const size_t w0_expected = E * size_t(shape.w0_rows()) * H, w1_expected = E * H * F;
  COMET_REQUIRE(weights.w0.size() == w0_expected, "reference: w0 has ", weights.w0.size(),
                " values, expected E*w0_rows*H = ", E, "*", shape.w0_rows(), "*", H, " = ", w0_expected, " (",
                to_string(shape.act), ")");
  COMET_REQUIRE(weights.w1.size() == w1_expected, "reference: w1 has ", weights.w1.size(),
                " values, expected E*H*F = ", E, "*", H, "*", F, " = ", w1_expected);
}

void check_expert_shard(const MoeShape& shape, int expert, int f_begin, int f_end) {
  COMET_REQUIRE(expert >= 0 && expert < shape.num_experts, "reference: expert ", expert, " out of range [0, ",
                shape.num_experts, ")");
  COMET_REQUIRE(0 <= f_begin && f_begin <= f_end && f_end <= shape.ffn, "reference: F-shard [", f_begin, ", ",
                f_end, ") is not inside [0, ", shape.ffn, ")");
}

template <class T>
void check_dout(const MoeShape& shape, const std::vector<RankInput<T>>& ranks, const RankOutputs<T>& dout) {
  COMET_REQUIRE(dout.size() == ranks.size(), "reference: dout has ", dout.size(), " ranks, expected ",
                ranks.size());
  for (size_t s = 0; s < ranks.size(); ++s) {
    const size_t expected = size_t(ranks[s].tokens) * shape.hidden;
    COMET_REQUIRE(dout[s].size() == expected, "reference: rank ", s, ": dout has ", dout[s].size(),
                  " values, expected tokens*H = ", ranks[s].tokens, "*", shape.hidden, " = ", expected);
  }
}

}  // namespace detail

template <class T>
void check_inputs(const MoeShape& shape, const Parallel& par, const ExpertWeights<T>& weights,
                  const std::vector<RankInput<T>>& ranks) {
  validate(shape, par);
  detail::check_weights(shape, weights);
  const int W = par.world(), H = shape.hidden, k = shape.topk, E = shape.num_experts;
  COMET_REQUIRE(int(ranks.size()) == W, "reference: got inputs for ", ranks.size(), " ranks, expected W = ep*tp = ",
                par.ep, "*", par.tp, " = ", W);
  for (int s = 0; s < W; ++s) {
    const RankInput<T>& r = ranks[s];
    COMET_REQUIRE(r.tokens >= 0, "reference: rank ", s, ": token count ", r.tokens, " is negative");
    const size_t T_s = size_t(r.tokens);
    COMET_REQUIRE(r.x.size() == T_s * H, "reference: rank ", s, ": x has ", r.x.size(),
                  " values, expected tokens*H = ", T_s, "*", H, " = ", T_s * H);
    COMET_REQUIRE(r.ids.size() == T_s * k, "reference: rank ", s, ": ids has ", r.ids.size(),
                  " values, expected tokens*k = ", T_s, "*", k, " = ", T_s * k);
    COMET_REQUIRE(r.gates.size() == T_s * k, "reference: rank ", s, ": gates has ", r.gates.size(),
                  " values, expected tokens*k = ", T_s, "*", k, " = ", T_s * k);
    for (size_t t = 0; t < T_s; ++t) {
      const int32_t* ids = &r.ids[t * k];
      for (int j = 0; j < k; ++j) {
        COMET_REQUIRE(ids[j] >= 0 && ids[j] < E, "reference: rank ", s, " token ", t, " slot ", j, ": expert id ",
                      ids[j], " out of range [0, ", E, ")");
        for (int i = 0; i < j; ++i)
          COMET_REQUIRE(ids[i] != ids[j], "reference: rank ", s, " token ", t, ": duplicate expert ", ids[j],
                        " in its top-k (slots ", i, " and ", j, ")");
      }
    }
  }
}

#define COMET_INSTANTIATE(T)                                                                            \
  template void detail::check_weights<T>(const MoeShape&, const ExpertWeights<T>&);                     \
  template void detail::check_dout<T>(const MoeShape&, const std::vector<RankInput<T>>&,               \
                                      const RankOutputs<T>&);                                           \
  template void check_inputs<T>(const MoeShape&, const Parallel&, const ExpertWeights<T>&,              \
                                const std::vector<RankInput<T>>&);
COMET_INSTANTIATE(float)
COMET_INSTANTIATE(double)
#undef COMET_INSTANTIATE

}  // namespace comet::reference
