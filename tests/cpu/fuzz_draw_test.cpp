// comet-fuzz's draws (tools/fuzz/fuzz_draw.hpp): reproducible from the seed, always a valid layer
// within the reference's budget, and covering the cases the fuzz run is meant to reach (every layout
// size, top-1 / top-8 / top-k = E, both links, tight capacity, training, each routing and fault).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "comet/reference.hpp"
#include "tools/fuzz/fuzz_draw.hpp"

using namespace comet;
using namespace comet::fuzz;

TEST(FuzzDraw, TheSeedReproducesFamilyAndBatches) {
  for (uint64_t seed : {1ull, 77ull, 123456789ull}) {
    const Family a = draw_family(seed), b = draw_family(seed);
    EXPECT_EQ(describe(a), describe(b));
    for (int i = 0; i < 5; ++i) {
      const Batch x = draw_batch(a, i), y = draw_batch(b, i);
      EXPECT_EQ(describe(x), describe(y));
      EXPECT_EQ(make_batch_routing(a, x)[0].ids, make_batch_routing(b, y)[0].ids);
    }
  }
  EXPECT_NE(describe(draw_family(1)), describe(draw_family(2)));
}

TEST(FuzzDraw, FamiliesAreValidAndCoverTheLayouts) {
  std::set<int> worlds, topks_equal_e;
  bool tp = false, ep_tp = false, top1 = false, top8 = false, k_is_e = false, host = false, device = false;
  bool tight = false, training = false, forced = false, tuned = false, odd_h = false, gelu = false, silu = false;
  int fp8 = 0, fp8_ep_tp = 0, fp8_host = 0, fused_act = 0, two_pass = 0, checked = 0, checked_training = 0;
  int cublas = 0, cublas_training = 0, m_order = 0, expert_pulls = 0, expert_pulls_m_order = 0;
  std::map<int, int> wave_chunks;
  for (uint64_t seed = 1; seed <= 3000; ++seed) {
    const Family f = draw_family(seed);
    const MoeShape& s = f.shape;
    ASSERT_NO_THROW(validate(s, f.par)) << describe(f);
    ASSERT_GE(f.max_tokens, 1);
    const double work = double(f.par.world()) * f.max_tokens * s.topk * s.hidden * (s.w0_rows() + s.ffn);
    ASSERT_LE(work, kMaxReferenceWork) << describe(f);
    worlds.insert(f.par.world());
    tp |= f.par.tp > 1 && f.par.ep == 1;
    ep_tp |= f.par.tp > 1 && f.par.ep > 1;
    top1 |= s.topk == 1;
    top8 |= s.topk == 8;
    k_is_e |= s.topk == s.num_experts && s.num_experts > 2;
    host |= f.link == Link::host;
    device |= f.link == Link::device;
    tight |= f.max_rows > 0;
    training |= f.options.training;
    if (f.fused_activation) ASSERT_TRUE(f.options.training) << describe(f);
    fused_act += f.fused_activation;
    two_pass += f.options.training && !f.fused_activation;
    if (f.options.check_schedule) ASSERT_FALSE(f.options.batch_invariant) << describe(f);
    checked += f.options.check_schedule;
    checked_training += f.options.check_schedule && f.options.training;
    if (f.options.layer1.standalone_gemm) {  // only where layer 1's sequential schedule is forced
      ASSERT_EQ(f.options.layer1.n_comm, 0) << describe(f);
      cublas += *f.options.layer1.standalone_gemm == StandaloneGemm::cublas;
      cublas_training += f.options.training;
    }
    if (f.options.layer0.m_order) ASSERT_GT(f.options.layer0.n_comm.value_or(0), 0) << describe(f);
    m_order += f.options.layer0.m_order.value_or(false);
    ++wave_chunks[f.options.wave_chunk];
    expert_pulls += f.options.pull_order == PullOrder::expert;
    expert_pulls_m_order += f.options.pull_order == PullOrder::expert && f.options.layer0.m_order.value_or(false);
    forced |= f.options.layer0.n_comm.has_value();
    tuned |= !f.options.layer1.n_comm.has_value();
    odd_h |= s.hidden % 64 != 0;
    gelu |= s.act == Activation::gelu;
    silu |= s.act == Activation::silu;
    if (f.options.dtype == DType::e4m3) {
      // What the fp8 layer can run: forward only, H in 128-wide scale blocks, its one tile.
      ASSERT_FALSE(f.options.training) << describe(f);
      ASSERT_EQ(s.hidden % 128, 0) << describe(f);
      ASSERT_TRUE(!f.options.layer0.tile_n || *f.options.layer0.tile_n == 128) << describe(f);
      ++fp8;
      fp8_ep_tp += f.par.tp > 1 && f.par.ep > 1;
      fp8_host += f.link == Link::host;
    }
  }
  EXPECT_GT(fp8, 100);
  EXPECT_GT(fp8_ep_tp, 5);
  EXPECT_GT(fp8_host, 20);
  EXPECT_GT(fused_act, 300);  // about half of the ~40 % training families, each way
  EXPECT_GT(two_pass, 300);
  EXPECT_GT(checked, 400);  // a quarter of the ~80 % families without batch_invariant
  EXPECT_GT(checked_training, 150);
  EXPECT_GT(cublas, 60);  // a third of the families that force layer 1's sequential schedule (~1 in 14)
  EXPECT_GT(cublas_training, 20);
  EXPECT_GT(m_order, 200);  // a third of the ~43 % families that force layer 0's fused schedule
  EXPECT_GT(expert_pulls, 1300);  // half each way, with m order among them
  EXPECT_LT(expert_pulls, 1700);
  EXPECT_GT(expert_pulls_m_order, 100);
  for (int chunk : {0, 1, 2, 3, 8}) EXPECT_GT(wave_chunks[chunk], 100) << "wave chunk " << chunk;  // a fifth each
  EXPECT_EQ(worlds, (std::set<int>{1, 2, 4, 8}));
  EXPECT_TRUE(tp && ep_tp && top1 && top8 && k_is_e && host && device && tight && training && forced && tuned && odd_h &&
              gelu && silu);
}

TEST(FuzzDraw, BatchesCoverRoutingsTokenCountsAndFaults) {
  std::set<comet::testing::RoutingKind> kinds;
  std::set<Fault> faults;
  bool nobody = false, one_rank_empty = false, single = false, full = false;
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    const Family f = draw_family(seed);
    for (int i = 0; i < 16; ++i) {
      const Batch b = draw_batch(f, i);
      ASSERT_EQ(int(b.tokens.size()), f.par.world());
      kinds.insert(b.routing);
      faults.insert(b.fault);
      int total = 0, empty = 0;
      for (int t : b.tokens) {
        total += t;
        empty += t == 0;
        single |= t == 1;
        full |= t == f.max_tokens;
        if (b.fault != Fault::tokens_over_capacity) ASSERT_LE(t, f.max_tokens);
      }
      nobody |= total == 0;
      one_rank_empty |= empty > 0 && total > 0;
      const auto routing = make_batch_routing(f, b);
      std::vector<reference::RankInput<float>> in(f.par.world());
      for (int r = 0; r < f.par.world(); ++r) {
        in[r].tokens = b.tokens[r];
        in[r].x.assign(size_t(b.tokens[r]) * f.shape.hidden, 0.f);
        in[r].ids = routing[r].ids;
        in[r].gates = routing[r].gates;
      }
      const reference::ExpertWeights<float> w{std::vector<float>(size_t(f.shape.num_experts) * f.shape.w0_rows() * f.shape.hidden),
                                              std::vector<float>(size_t(f.shape.num_experts) * f.shape.hidden * f.shape.ffn)};
      // The reference's own input check is the oracle of the id faults.
      if (b.fault == Fault::duplicate_id || b.fault == Fault::id_out_of_range) {
        EXPECT_THROW(reference::check_inputs(f.shape, f.par, w, in), InvalidArgument) << describe(b);
      } else if (b.fault == Fault::gate_not_finite) {
        EXPECT_FALSE(std::isfinite(in[b.fault_rank].gates[size_t(b.fault_token) * f.shape.topk + b.fault_slot]));
      } else {
        EXPECT_NO_THROW(reference::check_inputs(f.shape, f.par, w, in)) << describe(b);
      }
      if (b.fault == Fault::tokens_over_capacity) ASSERT_EQ(b.tokens[b.fault_rank], f.max_tokens + 1);
    }
  }
  EXPECT_EQ(kinds.size(), 5u);
  EXPECT_EQ(faults.size(), 5u);
  EXPECT_TRUE(nobody && one_rank_empty && single && full);
}

TEST(FuzzDraw, RowsNeededPadsEachExpertOfTheGroup) {
  Family f;
  f.shape = MoeShape{64, 64, 4, 2, Activation::swiglu};
  f.par = Parallel{2, 1};  // group 0: experts 0, 1; group 1: experts 2, 3
  comet::testing::RankRouting a, b;
  a.tokens = 130;
  for (int t = 0; t < 130; ++t) a.ids.insert(a.ids.end(), {0, 2});  // expert 0: 130 rows, expert 2: 130
  b.tokens = 1;
  b.ids = {1, 3};  // one row each for experts 1 and 3
  EXPECT_EQ(rows_needed(f, {a, b}, 0), 256 + 128);
  EXPECT_EQ(rows_needed(f, {a, b}, 1), 256 + 128);
  b.ids = {2, 3};
  EXPECT_EQ(rows_needed(f, {a, b}, 0), 256);
}
