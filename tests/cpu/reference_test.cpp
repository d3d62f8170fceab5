// The CPU reference (the oracle): forward against a naive per-token formula written here, the
// distributed evaluation against forward, the single-token pieces, backward against central finite
// differences in double, and input validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "comet/reference.hpp"
#include "support/expect_invalid.hpp"
#include "harness/routing_gen.hpp"

using namespace comet;
namespace ref = comet::reference;
using comet::testing::RoutingKind;
using comet::testing::expect_invalid;

namespace {

template <class T>
struct Problem {
  MoeShape shape;
  Parallel par;
  ref::ExpertWeights<T> w;
  std::vector<ref::RankInput<T>> ranks;
};

// Random bf16-exact weights and inputs with routing of the given kind. Weight scales keep the
// pre-activations O(1) so every activation is exercised on its curved part.
Problem<float> make_problem(MoeShape shape, Parallel par, std::vector<int> tokens, RoutingKind kind, uint64_t seed,
                            int hot = 0) {
  Problem<float> p{shape, par, {}, {}};
  const size_t E = shape.num_experts, H = shape.hidden, F = shape.ffn;
  p.w.w0 = comet::testing::random_bf16_values(E * shape.w0_rows() * H, 2.0f / std::sqrt(float(H)), seed);
  p.w.w1 = comet::testing::random_bf16_values(E * H * F, 2.0f / std::sqrt(float(F)), seed + 1);
  const auto routing = comet::testing::make_routing(shape, par, tokens, kind, seed + 2, hot);
  for (size_t s = 0; s < tokens.size(); ++s) {
    ref::RankInput<float> r;
    r.tokens = tokens[s];
    r.x = comet::testing::random_bf16_values(size_t(tokens[s]) * H, 1.0f, seed + 10 + s);
    r.ids = routing[s].ids;
    r.gates = routing[s].gates;
    p.ranks.push_back(std::move(r));
  }
  return p;
}

template <class U, class T>
std::vector<U> cast(const std::vector<T>& v) {
  return std::vector<U>(v.begin(), v.end());
}

Problem<double> to_double(const Problem<float>& p) {
  Problem<double> d{p.shape, p.par, {cast<double>(p.w.w0), cast<double>(p.w.w1)}, {}};
  for (const auto& r : p.ranks) d.ranks.push_back({r.tokens, cast<double>(r.x), r.ids, cast<double>(r.gates)});
  return d;
}

// The layer written out token by token, slot by slot, in double, independently of the library.
double naive_activation(Activation act, double z, double up) {
  const double kPi = 3.14159265358979323846;
  switch (act) {
    case Activation::swiglu: return z / (1.0 + std::exp(-z)) * up;
    case Activation::silu: return z / (1.0 + std::exp(-z));
    case Activation::gelu: return 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (z + 0.044715 * z * z * z)));
  }
  return 0;
}

std::vector<std::vector<double>> naive_forward(const Problem<float>& p) {
  const int H = p.shape.hidden, F = p.shape.ffn, k = p.shape.topk, R = p.shape.w0_rows();
  std::vector<std::vector<double>> out;
  for (const auto& r : p.ranks) {
    std::vector<double> o(size_t(r.tokens) * H, 0.0);
    for (int t = 0; t < r.tokens; ++t) {
      const float* x = &r.x[size_t(t) * H];
      for (int j = 0; j < k; ++j) {
        const int e = r.ids[size_t(t) * k + j];
        std::vector<double> hid(F);
        for (int f = 0; f < F; ++f) {
          double gate = 0, up = 0;
          for (int c = 0; c < H; ++c) {
            gate += double(p.w.w0[(size_t(e) * R + f) * H + c]) * x[c];
            if (is_gated(p.shape.act)) up += double(p.w.w0[(size_t(e) * R + F + f) * H + c]) * x[c];
          }
          hid[f] = naive_activation(p.shape.act, gate, up);
        }
        for (int h = 0; h < H; ++h) {
          double y = 0;
          for (int f = 0; f < F; ++f) y += double(p.w.w1[(size_t(e) * H + h) * F + f]) * hid[f];
          o[size_t(t) * H + h] += double(r.gates[size_t(t) * k + j]) * y;
        }
      }
    }
    out.push_back(std::move(o));
  }
  return out;
}

// Every rank's values agree to rel_tol of the largest magnitude in `want` (per rank).
template <class A, class B>
void expect_close(const std::vector<std::vector<A>>& got, const std::vector<std::vector<B>>& want, double rel_tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size()) << what << " rank " << s;
    double scale = 1e-30;
    for (auto v : want[s]) scale = std::max(scale, std::abs(double(v)));
    for (size_t i = 0; i < want[s].size(); ++i)
      ASSERT_NEAR(double(got[s][i]), double(want[s][i]), rel_tol * scale) << what << " rank " << s << " index " << i;
  }
}

const Activation kActivations[] = {Activation::swiglu, Activation::gelu, Activation::silu};

std::string label(const MoeShape& s, const Parallel& p, const char* routing) {
  return std::string(to_string(s.act)) + " k=" + std::to_string(s.topk) + " ep=" + std::to_string(p.ep) +
         " tp=" + std::to_string(p.tp) + " " + routing;
}

}  // namespace

// ---- forward against the naive formula ----------------------------------------------------------------

TEST(ReferenceForward, MatchesNaiveFormulaForEveryActivationAndTopK) {
  for (Activation act : kActivations)
    for (int k : {1, 2, 8}) {
      const MoeShape shape{16, 32, 8, k, act};
      const Parallel par{2, 2};
      SCOPED_TRACE(label(shape, par, "uniform"));
      const auto p = make_problem(shape, par, {5, 0, 7, 3}, RoutingKind::uniform, 100 + k);
      expect_close(ref::forward(p.shape, p.par, p.w, p.ranks), naive_forward(p), 1e-5, "forward");
    }
}

TEST(ReferenceForward, MatchesNaiveFormulaForSkewedRouting) {
  for (Activation act : kActivations) {
    // k = 1, every token to expert 5: all other experts get zero tokens.
    {
      const MoeShape shape{16, 16, 8, 1, act};
      const auto p = make_problem(shape, Parallel{4, 1}, {6, 4, 0, 9}, RoutingKind::one_expert, 7, 5);
      SCOPED_TRACE(label(shape, p.par, "one_expert"));
      expect_close(ref::forward(p.shape, p.par, p.w, p.ranks), naive_forward(p), 1e-5, "forward");
    }
    for (RoutingKind kind : {RoutingKind::zipf, RoutingKind::local_only, RoutingKind::one_expert}) {
      const MoeShape shape{24, 16, 8, 2, act};
      const auto p = make_problem(shape, Parallel{2, 1}, {11, 6}, kind, 31, 3);
      SCOPED_TRACE(label(shape, p.par, "skewed"));
      expect_close(ref::forward(p.shape, p.par, p.w, p.ranks), naive_forward(p), 1e-5, "forward");
    }
  }
}

TEST(ReferenceForward, ZeroTokenRanksGetEmptyOutputs) {
  const MoeShape shape{16, 16, 4, 2, Activation::swiglu};
  const auto p = make_problem(shape, Parallel{2, 1}, {0, 0}, RoutingKind::uniform, 3);
  const auto out = ref::forward(p.shape, p.par, p.w, p.ranks);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].empty());
  EXPECT_TRUE(out[1].empty());
  const auto q = make_problem(shape, Parallel{1, 2}, {0, 4}, RoutingKind::uniform, 4);
  const auto out2 = ref::forward(q.shape, q.par, q.w, q.ranks);
  EXPECT_TRUE(out2[0].empty());
  EXPECT_EQ(out2[1].size(), size_t(4 * 16));
}

TEST(ReferenceForward, DoubleAgreesWithFloat) {
  const MoeShape shape{32, 64, 8, 2, Activation::gelu};
  const auto p = make_problem(shape, Parallel{2, 2}, {9, 3, 0, 5}, RoutingKind::zipf, 77);
  const auto d = to_double(p);
  expect_close(ref::forward(p.shape, p.par, p.w, p.ranks), ref::forward(d.shape, d.par, d.w, d.ranks), 1e-5,
               "float vs double");
}

// ---- the distributed evaluation (sum over ranks' EP/TP partials) equals forward ------------------------

TEST(ReferenceDistributed, MatchesForwardForEveryLayout) {
  const Parallel layouts[] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}, {8, 1}, {1, 8}, {2, 4}, {4, 2}};
  for (Activation act : kActivations)
    for (const Parallel& par : layouts) {
      const MoeShape shape{64, 128, 8, 2, act};
      SCOPED_TRACE(label(shape, par, "uniform"));
      std::vector<int> tokens(par.world());
      for (int s = 0; s < par.world(); ++s) tokens[s] = (s == 1) ? 0 : 3 + 2 * s;  // rank 1 owns no tokens
      const auto p = make_problem(shape, par, tokens, RoutingKind::uniform, 500 + par.ep * 10 + par.tp);
      expect_close(ref::forward_distributed(p.shape, p.par, p.w, p.ranks), ref::forward(p.shape, p.par, p.w, p.ranks),
                   1e-5, "float");
      const auto d = to_double(p);
      expect_close(ref::forward_distributed(d.shape, d.par, d.w, d.ranks), ref::forward(d.shape, d.par, d.w, d.ranks),
                   1e-12, "double");
    }
}

TEST(ReferenceDistributed, MatchesForwardForSkewedRoutingAndLargeTopK) {
  struct Case {
    Parallel par;
    int k;
    RoutingKind kind;
  };
  const Case cases[] = {{{4, 2}, 1, RoutingKind::one_expert}, {{2, 4}, 8, RoutingKind::uniform},
                        {{8, 1}, 2, RoutingKind::zipf},       {{4, 2}, 2, RoutingKind::local_only},
                        {{1, 8}, 1, RoutingKind::one_expert}};
  for (const Case& c : cases) {
    const MoeShape shape{32, 128, 8, c.k, Activation::swiglu};
    SCOPED_TRACE(label(shape, c.par, "skewed"));
    std::vector<int> tokens(c.par.world(), 6);
    tokens.back() = 0;
    const auto d = to_double(make_problem(shape, c.par, tokens, c.kind, 900 + c.k, 6));
    expect_close(ref::forward_distributed(d.shape, d.par, d.w, d.ranks), ref::forward(d.shape, d.par, d.w, d.ranks),
                 1e-12, "double");
  }
}

// ---- single-token pieces --------------------------------------------------------------------------------

TEST(ReferencePieces, HiddenAndOutputShardsComposeToTheExpert) {
  for (Activation act : kActivations) {
    SCOPED_TRACE(to_string(act));
    const MoeShape shape{16, 32, 4, 1, act};
    auto p = make_problem(shape, Parallel{1, 1}, {1}, RoutingKind::one_expert, 41, 2);
    const int e = 2, F = shape.ffn, H = shape.hidden;
    const float* x = p.ranks[0].x.data();

    const auto hid = ref::expert_hidden(shape, p.w, e, x, 0, F);
    ASSERT_EQ(hid.size(), size_t(F));
    // Shards of the hidden vector are bitwise the slices of the whole one (same dot products).
    std::vector<float> concat;
    for (int f0 = 0; f0 < F; f0 += 8) {
      const auto part = ref::expert_hidden(shape, p.w, e, x, f0, f0 + 8);
      concat.insert(concat.end(), part.begin(), part.end());
    }
    EXPECT_EQ(concat, hid);

    // Partial outputs over the TP shards sum to the whole output; with gate 1 and k = 1 the whole
    // output is the layer's output (checked against the naive formula).
    const auto y = ref::expert_output(shape, p.w, e, hid.data(), 0, F);
    ASSERT_EQ(y.size(), size_t(H));
    std::vector<float> sum(H, 0.0f);
    for (int f0 = 0; f0 < F; f0 += 16) {
      const auto part = ref::expert_output(shape, p.w, e, hid.data() + f0, f0, f0 + 16);
      for (int h = 0; h < H; ++h) sum[h] += part[h];
    }
    expect_close(std::vector<std::vector<float>>{sum}, std::vector<std::vector<float>>{y}, 1e-5, "shards");
    p.ranks[0].gates[0] = 1.0f;
    expect_close(std::vector<std::vector<float>>{y}, naive_forward(p), 1e-5, "naive");
  }
}

// ---- backward against central finite differences (double) -----------------------------------------------

namespace {

double loss(const Problem<double>& p, const std::vector<std::vector<double>>& dout) {
  const auto out = ref::forward(p.shape, p.par, p.w, p.ranks);
  double l = 0;
  for (size_t s = 0; s < out.size(); ++s)
    for (size_t i = 0; i < out[s].size(); ++i) l += out[s][i] * dout[s][i];
  return l;
}

// Checks analytic[i] against (L(v_i + eps) - L(v_i - eps)) / 2 eps for every element of `values`.
void expect_matches_finite_differences(Problem<double>& p, const std::vector<std::vector<double>>& dout,
                                       std::vector<double>& values, const std::vector<double>& analytic,
                                       const std::string& what) {
  ASSERT_EQ(values.size(), analytic.size()) << what;
  const double eps = 1e-6;
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    values[i] = v + eps;
    const double lp = loss(p, dout);
    values[i] = v - eps;
    const double lm = loss(p, dout);
    values[i] = v;
    const double fd = (lp - lm) / (2 * eps);
    ASSERT_NEAR(analytic[i], fd, 1e-7 * (1 + std::abs(fd))) << what << " index " << i;
  }
}

void check_backward(const MoeShape& shape, const Parallel& par, std::vector<int> tokens, RoutingKind kind,
                    uint64_t seed) {
  auto p = to_double(make_problem(shape, par, tokens, kind, seed, 1));
  std::vector<std::vector<double>> dout;
  for (size_t s = 0; s < tokens.size(); ++s)
    dout.push_back(cast<double>(comet::testing::random_bf16_values(size_t(tokens[s]) * shape.hidden, 1.0f, seed + 50 + s)));
  const auto g = ref::backward(p.shape, p.par, p.w, p.ranks, dout);
  for (size_t s = 0; s < p.ranks.size(); ++s) {
    expect_matches_finite_differences(p, dout, p.ranks[s].x, g.dx[s], "dx rank " + std::to_string(s));
    expect_matches_finite_differences(p, dout, p.ranks[s].gates, g.dgates[s], "dgates rank " + std::to_string(s));
  }
  expect_matches_finite_differences(p, dout, p.w.w0, g.dw0, "dw0");
  expect_matches_finite_differences(p, dout, p.w.w1, g.dw1, "dw1");
}

}  // namespace

TEST(ReferenceBackward, MatchesFiniteDifferencesTopK2) {
  for (Activation act : kActivations) {
    SCOPED_TRACE(to_string(act));
    check_backward(MoeShape{8, 8, 4, 2, act}, Parallel{2, 1}, {3, 2}, RoutingKind::uniform, 11);
  }
}

TEST(ReferenceBackward, MatchesFiniteDifferencesTopK1OneExpertAndZeroTokenRank) {
  // Every token to expert 1: the other experts' weight gradients must be exactly zero.
  for (Activation act : kActivations) {
    SCOPED_TRACE(to_string(act));
    check_backward(MoeShape{8, 16, 4, 1, act}, Parallel{1, 2}, {4, 0}, RoutingKind::one_expert, 23);
  }
  const MoeShape shape{8, 8, 4, 1, Activation::swiglu};
  auto p = to_double(make_problem(shape, Parallel{1, 1}, {5}, RoutingKind::one_expert, 5, 1));
  const auto g = ref::backward(p.shape, p.par, p.w, p.ranks, {std::vector<double>(5 * 8, 1.0)});
  const size_t per0 = size_t(shape.w0_rows()) * shape.hidden, per1 = size_t(shape.hidden) * shape.ffn;
  for (int e : {0, 2, 3}) {
    EXPECT_TRUE(std::all_of(g.dw0.begin() + e * per0, g.dw0.begin() + (e + 1) * per0, [](double v) { return v == 0; }));
    EXPECT_TRUE(std::all_of(g.dw1.begin() + e * per1, g.dw1.begin() + (e + 1) * per1, [](double v) { return v == 0; }));
  }
}

TEST(ReferenceBackward, MatchesFiniteDifferencesAllExpertsChosen) {
  for (Activation act : kActivations) {
    SCOPED_TRACE(to_string(act));
    check_backward(MoeShape{8, 8, 4, 4, act}, Parallel{2, 1}, {2, 3}, RoutingKind::zipf, 37);
  }
}

TEST(ReferenceBackward, FloatAgreesWithDouble) {
  const MoeShape shape{32, 64, 8, 2, Activation::swiglu};
  const auto p = make_problem(shape, Parallel{2, 2}, {7, 0, 4, 6}, RoutingKind::uniform, 61);
  const auto d = to_double(p);
  std::vector<std::vector<float>> dout_f;
  std::vector<std::vector<double>> dout_d;
  for (size_t s = 0; s < p.ranks.size(); ++s) {
    dout_f.push_back(comet::testing::random_bf16_values(size_t(p.ranks[s].tokens) * shape.hidden, 1.0f, 70 + s));
    dout_d.push_back(cast<double>(dout_f.back()));
  }
  const auto gf = ref::backward(p.shape, p.par, p.w, p.ranks, dout_f);
  const auto gd = ref::backward(d.shape, d.par, d.w, d.ranks, dout_d);
  expect_close(gf.dx, gd.dx, 1e-5, "dx");
  expect_close(gf.dgates, gd.dgates, 1e-5, "dgates");
  expect_close(std::vector<std::vector<float>>{gf.dw0}, std::vector<std::vector<double>>{gd.dw0}, 1e-5, "dw0");
  expect_close(std::vector<std::vector<float>>{gf.dw1}, std::vector<std::vector<double>>{gd.dw1}, 1e-5, "dw1");
}

// ---- validation -------------------------------------------------------------------------------------------

TEST(ReferenceValidation, RejectsBadInputWithClearMessages) {
  const MoeShape shape{16, 16, 4, 2, Activation::swiglu};
  const Parallel par{2, 1};
  const auto good = make_problem(shape, par, {3, 2}, RoutingKind::uniform, 1);
  EXPECT_NO_THROW(ref::forward(good.shape, good.par, good.w, good.ranks));

  auto run = [&](auto mutate) {
    return [=]() {
      auto p = good;
      mutate(p);
      ref::forward(p.shape, p.par, p.w, p.ranks);
    };
  };
  expect_invalid(run([](auto& p) { p.ranks.pop_back(); }), "got inputs for 1 ranks, expected W = ep*tp = 2*1 = 2");
  expect_invalid(run([](auto& p) { p.par = Parallel{3, 1}; }), "divisible by ep");
  expect_invalid(run([](auto& p) { p.ranks[1].x.pop_back(); }), "rank 1: x has 31 values, expected tokens*H");
  expect_invalid(run([](auto& p) { p.ranks[0].ids.push_back(0); }), "rank 0: ids has 7 values");
  expect_invalid(run([](auto& p) { p.ranks[0].gates.clear(); }), "rank 0: gates has 0 values");
  expect_invalid(run([](auto& p) { p.ranks[1].tokens = -1; }), "token count -1 is negative");
  expect_invalid(run([](auto& p) { p.ranks[1].ids[3] = 4; }),
                 "rank 1 token 1 slot 1: expert id 4 out of range [0, 4)");
  expect_invalid(run([](auto& p) { p.ranks[0].ids[0] = -1; }), "expert id -1 out of range");
  expect_invalid(run([](auto& p) { p.ranks[0].ids[5] = p.ranks[0].ids[4]; }),
                 "rank 0 token 2: duplicate expert");
  expect_invalid(run([](auto& p) { p.w.w0.resize(p.w.w0.size() / 2); }), "w0 has");
  expect_invalid(run([](auto& p) { p.w.w1.push_back(0); }), "w1 has");
  expect_invalid(run([](auto& p) { p.shape.act = Activation::gelu; }), "w0 has");  // swiglu-sized w0

  // The distributed helper and backward check the same things, and backward checks dout.
  auto bad_ids = good;
  bad_ids.ranks[0].ids[1] = 9;
  expect_invalid([&] { ref::forward_distributed(bad_ids.shape, bad_ids.par, bad_ids.w, bad_ids.ranks); },
                 "expert id 9 out of range");
  std::vector<std::vector<float>> dout{std::vector<float>(3 * 16), std::vector<float>(2 * 16)};
  EXPECT_NO_THROW(ref::backward(good.shape, good.par, good.w, good.ranks, dout));
  expect_invalid([&] { ref::backward(bad_ids.shape, bad_ids.par, bad_ids.w, bad_ids.ranks, dout); }, "expert id 9");
  dout[1].pop_back();
  expect_invalid([&] { ref::backward(good.shape, good.par, good.w, good.ranks, dout); }, "rank 1: dout has 31 values");
  dout.pop_back();
  expect_invalid([&] { ref::backward(good.shape, good.par, good.w, good.ranks, dout); }, "dout has 1 ranks");

  const float* x = good.ranks[0].x.data();
  expect_invalid([&] { ref::expert_hidden(shape, good.w, 4, x, 0, 16); }, "expert 4 out of range [0, 4)");
  expect_invalid([&] { ref::expert_hidden(shape, good.w, 0, x, 8, 17); }, "F-shard [8, 17) is not inside");
  expect_invalid([&] { ref::expert_output(shape, good.w, 0, x, 9, 8); }, "F-shard [9, 8)");
}
