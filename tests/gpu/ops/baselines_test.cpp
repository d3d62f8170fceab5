// The baselines (SequentialMoe, ChunkedMoe) on W virtual ranks (LocalTeam) against the CPU reference:
// every rank's output, the hidden rows after GEMM0 + activation and the expert outputs after GEMM1, for
// EP, TP and EP x TP, link=device and link=host, the ugly routings, both cuBLAS paths and C in {2,4,8}.
// Each system runs on a fresh team and FusedMoe, so a partial row one system forgot to ship cannot be
// covered by the one an earlier system wrote.
// SequentialMoe's and ChunkedMoe's backwards against the CPU reference backward (dx, the gate gradients,
// dW0, dW1), for EP, TP and EP x TP, both cuBLAS paths, every activation, bf16 weight gradients and
// accumulation.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "baselines/baselines.hpp"
#include "comet/bf16.hpp"
#include "comet/fused_moe.hpp"
#include "comet/reference.hpp"
#include "comet/weight_layout.hpp"
#include "support/layer_checks.hpp"
#include "support/test_shapes.hpp"
#include "harness/moe_problem.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

struct Case {
  const char* name;
  MoeShape shape;
  Parallel par;
  std::vector<int> tokens;
  RoutingKind kind = RoutingKind::uniform;
  Link link = Link::device;
  int hot = 0;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

// A baseline configuration: sequential, or chunked with `chunks` remote chunks.
struct System {
  const char* name;
  bool chunked;
  int chunks;
  GemmPath path;
  bool check_layers;  // also compare the hidden rows and expert outputs (CPU-heavy: two systems per case)
};

const System kSystems[] = {
    {"sequential_grouped", false, 0, GemmPath::grouped, true}, {"sequential_loop", false, 0, GemmPath::loop, false},
    {"chunked2_grouped", true, 2, GemmPath::grouped, false},   {"chunked2_loop", true, 2, GemmPath::loop, false},
    {"chunked4_grouped", true, 4, GemmPath::grouped, false},   {"chunked4_loop", true, 4, GemmPath::loop, true},
    {"chunked8_grouped", true, 8, GemmPath::grouped, false},   {"chunked8_loop", true, 8, GemmPath::loop, false},
};

// The problem and each rank's device data, shared by the systems of a case.
struct Problem {
  MoeProblem problem;
  std::vector<std::unique_ptr<DeviceRank>> ranks;
  explicit Problem(const Case& c, uint64_t seed = 3)
      : problem(MoeProblem::make(c.shape, c.par, c.tokens, c.kind, seed, c.hot)) {
    for (int r = 0; r < c.par.world(); ++r) ranks.push_back(upload_rank(problem, r));
  }
  std::vector<RankBatch> batches() const {
    std::vector<RankBatch> b;
    for (const auto& r : ranks) b.push_back(r->batch());
    return b;
  }
  void poison_outputs() {
    for (auto& r : ranks) r->out.fill_bytes(0xFF);  // NaN: every element must be written again
  }
  std::vector<std::vector<float>> outputs() const {
    std::vector<std::vector<float>> o;
    for (const auto& r : ranks) o.push_back(r->output());
    return o;
  }
};

// A fresh team and layer for one system run.
struct Layer {
  LocalTeam team;
  FusedMoe moe;
  Layer(const Problem& p, Link link)
      : team(p.problem.par.world(), link),
        moe(team, p.problem.shape, p.problem.par, MoeCapacity{p.problem.max_tokens(), 0}) {}
};

// Runs `sys` once over the problem; returns every rank's output. The layer is left as the run left it.
std::vector<std::vector<float>> run_system(Problem& p, Layer& l, const System& sys) {
  p.poison_outputs();
  const int W = p.problem.par.world();
  if (sys.chunked) {
    ChunkedOptions o;
    o.chunks = sys.chunks;
    o.gemm0 = o.gemm1 = sys.path;
    ChunkedMoe chunked(l.moe, o);
    for (int r = 0; r < W; ++r) chunked.set_weights(r, p.ranks[r]->w0.get(), p.ranks[r]->w1.get());
    chunked.forward(p.batches());
    l.moe.sync_and_check();
    for (int r = 0; r < W; ++r) EXPECT_EQ(chunked.chunks(r), std::min(sys.chunks, W - 1)) << "rank " << r;
  } else {
    SequentialOptions o;
    o.gemm0 = o.gemm1 = sys.path;
    SequentialMoe seq(l.moe, o);
    for (int r = 0; r < W; ++r) seq.set_weights(r, p.ranks[r]->w0.get(), p.ranks[r]->w1.get());
    seq.forward(p.batches());
    l.moe.sync_and_check();
  }
  return p.outputs();
}

class BaselinesCase : public ::testing::TestWithParam<Case> {};

TEST_P(BaselinesCase, MatchesReference) {
  const Case& c = GetParam();
  Problem p(c);
  const auto ref = reference::forward(p.problem.shape, p.problem.par, p.problem.weights, p.problem.inputs);
  for (const System& sys : kSystems) {
    SCOPED_TRACE(sys.name);
    Layer l(p, c.link);
    const auto got = run_system(p, l, sys);
    expect_outputs_match(p.problem, ref, got, sys.name);
    if (sys.check_layers) expect_layers_match(p.problem, l.moe.engine(), l.team, sys.name);
  }
}

const MoeShape kTop1E8{256, 512, 8, 1, Activation::swiglu};

INSTANTIATE_TEST_SUITE_P(
    Layouts, BaselinesCase,
    ::testing::Values(
        Case{"W1_single_rank", kSmallSwiglu, {1, 1}, {300}},
        Case{"EP2_device", kSmallSwiglu, {2, 1}, {37, 200}},
        Case{"EP2_host", kSmallSwiglu, {2, 1}, {130, 64}, RoutingKind::uniform, Link::host},
        Case{"EP4_zero_token_rank", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}},
        Case{"EP8_top8_host", kTop8, {8, 1}, {100, 0, 33, 257, 1, 64, 128, 5}, RoutingKind::uniform, Link::host},
        Case{"EP4_all_to_one_expert_top1", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert},
        Case{"EP8_top1_all_to_expert0_host", kTop1E8, {8, 1}, {50, 70, 0, 33, 128, 9, 1, 200}, RoutingKind::one_expert,
             Link::host},
        Case{"EP4_zipf", kSmallSwiglu, {4, 1}, {300, 250, 20, 77}, RoutingKind::zipf},
        Case{"EP4_local_only", kSmallSwiglu, {4, 1}, {64, 65, 66, 67}, RoutingKind::local_only},
        Case{"TP4_gelu", kGelu, {1, 4}, {50, 70, 0, 129}},
        Case{"TP2_host", kSmallSwiglu, {1, 2}, {160, 31}, RoutingKind::uniform, Link::host},
        Case{"TP8_top8_host", kTop8, {1, 8}, {40, 0, 90, 17, 64, 3, 128, 1}, RoutingKind::uniform, Link::host},
        Case{"EP2xTP2", kTop8, {2, 2}, {80, 0, 150, 41}},
        Case{"EP4xTP2_zipf_host", kSmallSwiglu, {4, 2}, {20, 40, 60, 80, 100, 0, 7, 130}, RoutingKind::zipf, Link::host},
        Case{"EP8_one_expert_hot5", kTop8, {8, 1}, {64, 64, 64, 64, 64, 64, 64, 64}, RoutingKind::one_expert,
             Link::device, 5}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// A baseline run twice on the same layer gives the same bits (fixed GEMM problems, deterministic combine).
TEST(Baselines, RepeatedForwardIsBitwiseStable) {
  const Case c{"repeat", kTop8, {4, 1}, {200, 150, 0, 99}, RoutingKind::uniform, Link::host};
  Problem p(c);
  for (const System& sys : {kSystems[0], kSystems[4]}) {
    Layer l(p, c.link);
    const auto first = run_system(p, l, sys);
    for (int rep = 0; rep < 3; ++rep) {
      const auto again = run_system(p, l, sys);
      for (size_t r = 0; r < first.size(); ++r)
        EXPECT_EQ(0, std::memcmp(first[r].data(), again[r].data(), first[r].size() * 4))
            << sys.name << " repeat " << rep << " rank " << r;
    }
  }
}

// The stage layout: stage 0 is the local position; the remote positions 1..W-1 split into min(C, W-1)
// groups of consecutive positions; unit ranges tile [0, num_units) in order, and for every expert the
// stages' row ranges tile its segment, each row's unit lying in its stage's unit range.
TEST(Baselines, ChunkStagesTileUnitsAndRows) {
  const MoeShape shape{256, 512, 16, 4, Activation::swiglu};
  for (const Parallel par : {Parallel{8, 1}, Parallel{4, 2}, Parallel{2, 1}, Parallel{1, 1}}) {
    const int W = par.world();
    std::vector<int> tokens;
    for (int s = 0; s < W; ++s) tokens.push_back(s == 1 ? 0 : 40 + 13 * s);
    const auto routing = make_routing(shape, par, tokens, RoutingKind::zipf, 11);
    for (int rank = 0; rank < W; ++rank) {
      const PlanConfig cfg{shape, par, rank, 32, PlanCapacity{200, 32 * 200}};
      const HostPlan plan = build_plan_host(cfg, views(routing));
      const PlanView& v = plan.view();
      const int el = cfg.local_experts(), units = *v.num_units;
      const std::vector<int> seg_off(v.segment_offset, v.segment_offset + el * W);
      const std::vector<int> seg_rows(v.segment_rows, v.segment_rows + el * W);
      const std::vector<int> unit_src(v.unit_src, v.unit_src + units);
      for (int chunks : {1, 2, 3, 4, 7, 8, 20}) {
        SCOPED_TRACE(::testing::Message() << "W " << W << " rank " << rank << " chunks " << chunks);
        const auto stages = plan_chunk_stages(rank, W, el, chunks, seg_off, seg_rows, unit_src);
        ASSERT_EQ(int(stages.size()), 1 + std::min(chunks, W - 1));
        EXPECT_EQ(stages[0].pos_begin, 0);
        EXPECT_EQ(stages[0].pos_end, 1);
        EXPECT_EQ(stages[0].unit_begin, 0);
        EXPECT_EQ(stages[0].unit_end, *v.num_local_units);
        EXPECT_EQ(stages.back().pos_end, W);
        EXPECT_EQ(stages.back().unit_end, units);
        for (size_t i = 1; i < stages.size(); ++i) {
          EXPECT_EQ(stages[i].pos_begin, stages[i - 1].pos_end);
          EXPECT_EQ(stages[i].unit_begin, stages[i - 1].unit_end);
          EXPECT_LT(stages[i].pos_begin, stages[i].pos_end);
        }
        for (const ChunkStage& st : stages) {
          for (int u = st.unit_begin; u < st.unit_end; ++u) {
            const int pos = cfg.position_of(v.unit_src[u]);
            EXPECT_TRUE(pos >= st.pos_begin && pos < st.pos_end) << "unit " << u;
          }
        }
        for (int e = 0; e < el; ++e) {
          int row = v.expert_offset[e];
          for (const ChunkStage& st : stages) {
            EXPECT_EQ(st.row_begin[e], row) << "expert " << e;
            for (int q = st.row_begin[e]; q < st.row_begin[e] + st.row_count[e]; ++q) {
              EXPECT_TRUE(v.row_unit[q] >= st.unit_begin && v.row_unit[q] < st.unit_end) << "row " << q;
            }
            row += st.row_count[e];
          }
          EXPECT_EQ(row, v.expert_offset[e] + v.expert_rows[e]) << "expert " << e;
        }
      }
    }
  }
}

TEST(Baselines, RejectBadOptionsAndRanks) {
  const Case c{"bad", kSmallSwiglu, {2, 1}, {10, 10}};
  Problem p(c);
  Layer l(p, c.link);
  ChunkedOptions zero_chunks;
  zero_chunks.chunks = 0;
  EXPECT_THROW(ChunkedMoe(l.moe, zero_chunks), InvalidArgument);
  SequentialOptions bad_tile;
  bad_tile.tile_n = 192;
  EXPECT_THROW(SequentialMoe(l.moe, bad_tile), InvalidArgument);

  SequentialMoe seq(l.moe);
  EXPECT_THROW(seq.layer0(0), InvalidArgument);   // not prepared
  EXPECT_THROW(seq.prepare(0), InvalidArgument);  // no weights given to the baseline
  EXPECT_THROW(seq.set_weights(5, p.ranks[0]->w0.get(), p.ranks[0]->w1.get()), InvalidArgument);

  ChunkedOptions no_comm;
  no_comm.comm_blocks = 0;
  ChunkedMoe chunked(l.moe, no_comm);
  for (int r = 0; r < 2; ++r) chunked.set_weights(r, p.ranks[r]->w0.get(), p.ranks[r]->w1.get());
  EXPECT_THROW(chunked.run(0), InvalidArgument);  // no setup
  for (int r = 0; r < 2; ++r) l.moe.engine().stage(r, p.ranks[r]->batch());
  l.team.barrier();
  l.moe.engine().prepare(0);
  EXPECT_THROW(chunked.setup(0), InvalidArgument);  // comm_blocks 0
  l.team.synchronize();
}

// Bad routing is raised when the baseline's host reads the plan, before any GEMM runs.
TEST(Baselines, ReportBadRouting) {
  const Case c{"badroute", kSmallSwiglu, {2, 1}, {10, 10}};
  for (const System& sys : {kSystems[0], kSystems[2]}) {
    Problem p(c);
    std::vector<int32_t> ids = p.problem.inputs[1].ids;
    ids[7] = 99;  // token 3, slot 1
    p.ranks[1]->ids.upload(ids);
    Layer l(p, c.link);
    try {
      run_system(p, l, sys);
      ADD_FAILURE() << sys.name << ": bad routing was not reported";
    } catch (const DeviceReportedError& e) {
      EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
    }
    l.team.synchronize();
  }
}

// ---- backward ------------------------------------------------------------------------------------------

// One rank's gradient buffers; the outputs start as NaN (0xFF bytes) so that every element must be written.
struct GradBuffers {
  DeviceBuffer dout, dx, dgates, dw0, dw1;
  RankGrad grad() const { return RankGrad{dout.get(), dx.get(), dgates.as<float>(), dw0.get(), dw1.get()}; }
};

// SequentialMoe's (or, with chunks > 0, ChunkedMoe's) forward and backward on a fresh layer built for
// training, with random output gradients.
struct BackwardRun {
  Problem& p;
  GradType type;
  LocalTeam team;
  FusedMoe moe;
  SequentialMoe seq;
  std::unique_ptr<ChunkedMoe> chunked;
  std::vector<std::vector<float>> dout;  // per rank [T][H]
  std::vector<GradBuffers> grads;

  static MoeOptions training() {
    MoeOptions o;
    o.training = true;
    return o;
  }
  static SequentialOptions paths(GemmPath path) {
    SequentialOptions o;
    o.gemm0 = o.gemm1 = o.grad1 = o.grad0 = path;
    return o;
  }

  static ChunkedOptions chunked_options(GemmPath path, int chunks) {
    ChunkedOptions o;
    o.chunks = chunks;
    o.comm_blocks = 8;
    o.gemm0 = o.gemm1 = o.grad1 = o.grad0 = path;
    return o;
  }

  BackwardRun(Problem& problem, Link link, GemmPath path, GradType grad_type, int chunks = 0)
      : p(problem),
        type(grad_type),
        team(problem.problem.par.world(), link),
        moe(team, problem.problem.shape, problem.problem.par, MoeCapacity{problem.problem.max_tokens(), 0}, training()),
        seq(moe, paths(path)) {
    team.set_timeout(3.0);  // a stalled flag fails the test in seconds, not minutes
    if (chunks > 0) chunked = std::make_unique<ChunkedMoe>(moe, chunked_options(path, chunks));
    const MoeShape& s = p.problem.shape;
    const Parallel& par = p.problem.par;
    const int H = s.hidden, k = s.topk, El = par.local_experts(s), Fs = par.ffn_shard(s);
    const size_t wbytes = type == GradType::f32 ? 4 : 2;
    for (int r = 0; r < par.world(); ++r) {
      seq.set_weights(r, p.ranks[r]->w0.get(), p.ranks[r]->w1.get());
      if (chunked) chunked->set_weights(r, p.ranks[r]->w0.get(), p.ranks[r]->w1.get());
      const int T = p.problem.inputs[r].tokens;
      dout.push_back(random_bf16_values(size_t(T) * H, 1.0f, 1000 + r));
      GradBuffers g;
      g.dout = DeviceBuffer(to_bf16(dout[r]));
      g.dx = DeviceBuffer(size_t(T) * H * 2);
      g.dgates = DeviceBuffer(size_t(T) * k * 4);
      g.dw0 = DeviceBuffer(size_t(El) * (s.w0_rows() / par.tp) * H * wbytes);
      g.dw1 = DeviceBuffer(size_t(El) * H * Fs * wbytes);
      for (DeviceBuffer* b : {&g.dx, &g.dgates, &g.dw0, &g.dw1}) b->fill_bytes(0xFF);
      grads.push_back(std::move(g));
    }
  }

  // One training forward and its backward.
  void step(bool accumulate) {
    std::vector<RankGrad> list;
    for (const GradBuffers& g : grads) list.push_back(g.grad());
    if (chunked) {
      chunked->forward(p.batches());
      chunked->backward(list, BackwardOptions{type, accumulate});
    } else {
      seq.forward(p.batches());
      seq.backward(list, BackwardOptions{type, accumulate});
    }
    moe.sync_and_check();
  }

  std::vector<float> as_float(const DeviceBuffer& b, size_t n, GradType t) const {
    return t == GradType::f32 ? b.download<float>(n) : from_bf16(b.download<bf16_bits>(n));
  }
  // What the backward wrote, laid out as reference::backward gives it.
  reference::Gradients<float> gradients() const {
    const MoeShape& s = p.problem.shape;
    const Parallel& par = p.problem.par;
    const int H = s.hidden, k = s.topk, El = par.local_experts(s), Fs = par.ffn_shard(s);
    reference::Gradients<float> g;
    g.dw0.assign(p.problem.weights.w0.size(), 0.f);
    g.dw1.assign(p.problem.weights.w1.size(), 0.f);
    for (int r = 0; r < par.world(); ++r) {
      const size_t T = size_t(p.problem.inputs[r].tokens);
      g.dx.push_back(as_float(grads[r].dx, T * H, GradType::bf16));
      g.dgates.push_back(grads[r].dgates.download<float>(T * k));
      unshard_add_w0(s, par, r, as_float(grads[r].dw0, size_t(El) * (s.w0_rows() / par.tp) * H, type), g.dw0);
      unshard_add_w1(s, par, r, as_float(grads[r].dw1, size_t(El) * H * Fs, type), g.dw1);
    }
    return g;
  }
  reference::Gradients<float> reference() const {
    return reference::backward(p.problem.shape, p.problem.par, p.problem.weights, p.problem.inputs, dout);
  }
};

class SequentialBackwardCase : public ::testing::TestWithParam<Case> {};

TEST_P(SequentialBackwardCase, MatchesReference) {
  const Case& c = GetParam();
  Problem p(c);
  std::unique_ptr<reference::Gradients<float>> ref;
  for (GemmPath path : {GemmPath::grouped, GemmPath::loop}) {
    SCOPED_TRACE(to_string(path));
    BackwardRun run(p, c.link, path, GradType::f32);
    if (!ref) ref = std::make_unique<reference::Gradients<float>>(run.reference());
    run.step(false);
    expect_gradients_match(p.problem, run.dout, *ref, run.gradients(),
                           std::string("sequential backward, ") + to_string(path));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SequentialBackwardCase,
    ::testing::Values(
        Case{"W1_single_rank", kSmallSwiglu, {1, 1}, {300}},
        Case{"EP2_device", kSmallSwiglu, {2, 1}, {37, 200}},
        Case{"EP2_host", kSmallSwiglu, {2, 1}, {130, 64}, RoutingKind::uniform, Link::host},
        Case{"EP4_zero_token_rank", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}},
        Case{"EP4_all_to_one_expert_top1_silu", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert},
        Case{"EP4_zipf_host", kSmallSwiglu, {4, 1}, {300, 250, 20, 77}, RoutingKind::zipf, Link::host},
        Case{"TP2_host", kSmallSwiglu, {1, 2}, {160, 31}, RoutingKind::uniform, Link::host},
        Case{"TP4_gelu", kGelu, {1, 4}, {50, 70, 0, 129}},
        Case{"EP2xTP2_top8", kTop8, {2, 2}, {80, 0, 150, 41}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// ChunkedMoe's backward: the same cases, in 1 and 3 remote chunks (3: as many as W - 1 at W 4, so
// every stage has its own pull and combine), both cuBLAS paths.
class ChunkedBackwardCase : public ::testing::TestWithParam<Case> {};

TEST_P(ChunkedBackwardCase, MatchesReference) {
  const Case& c = GetParam();
  Problem p(c);
  std::unique_ptr<reference::Gradients<float>> ref;
  for (int chunks : {1, 3})
    for (GemmPath path : {GemmPath::grouped, GemmPath::loop}) {
      const std::string what = "chunked backward, C " + std::to_string(chunks) + ", " + to_string(path);
      SCOPED_TRACE(what);
      BackwardRun run(p, c.link, path, GradType::f32, chunks);
      if (!ref) ref = std::make_unique<reference::Gradients<float>>(run.reference());
      run.step(false);
      expect_gradients_match(p.problem, run.dout, *ref, run.gradients(), what);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ChunkedBackwardCase,
    ::testing::Values(
        Case{"W1_single_rank", kSmallSwiglu, {1, 1}, {300}},
        Case{"EP4_zero_token_rank", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}},
        Case{"EP4_all_to_one_expert_top1_silu", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert},
        Case{"EP4_zipf_host", kSmallSwiglu, {4, 1}, {300, 250, 20, 77}, RoutingKind::zipf, Link::host},
        Case{"TP4_gelu", kGelu, {1, 4}, {50, 70, 0, 129}},
        Case{"EP2xTP2_top8", kTop8, {2, 2}, {80, 0, 150, 41}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// bf16 weight gradients, overwritten and then accumulated: the second backward of an identical forward
// doubles them (up to the rounding of the bf16 sum); dx and the gate gradients are not accumulated.
TEST(SequentialBackward, Bf16GradientsAccumulate) {
  const Case c{"accumulate", kTop8, {4, 1}, {120, 0, 77, 200}, RoutingKind::uniform, Link::host};
  Problem p(c);
  BackwardRun run(p, c.link, GemmPath::grouped, GradType::bf16);
  const auto ref = run.reference();
  run.step(false);
  const auto once = run.gradients();
  expect_gradients_match(p.problem, run.dout, ref, once, "bf16 gradients");
  run.step(true);
  const auto twice = run.gradients();
  std::vector<float> dw0 = once.dw0, dw1 = once.dw1;
  for (float& v : dw0) v *= 2;
  for (float& v : dw1) v *= 2;
  EXPECT_LT(relative_error(twice.dw0, dw0), 1e-2) << "dW0 accumulated";
  EXPECT_LT(relative_error(twice.dw1, dw1), 1e-2) << "dW1 accumulated";
  for (size_t r = 0; r < once.dx.size(); ++r) {
    EXPECT_LT(relative_error(twice.dx[r], once.dx[r]), 1e-6) << "dx, rank " << r;
    EXPECT_LT(relative_error(twice.dgates[r], once.dgates[r]), 1e-6) << "dgates, rank " << r;
  }
}

// The backward needs a layer built for training, and its steps need prepare_grad.
TEST(SequentialBackward, Refusals) {
  const Case c{"refuse", kSmallSwiglu, {2, 1}, {10, 10}};
  Problem p(c);
  {
    Layer l(p, c.link);  // built for inference
    SequentialMoe seq(l.moe);
    for (int r = 0; r < 2; ++r) seq.set_weights(r, p.ranks[r]->w0.get(), p.ranks[r]->w1.get());
    seq.forward(p.batches());
    EXPECT_THROW(seq.prepare_grad(0), InvalidArgument);
    l.team.synchronize();
  }
  BackwardRun run(p, c.link, GemmPath::grouped, GradType::f32);
  EXPECT_THROW(run.seq.grad_gemm1(0), InvalidArgument);  // not prepared for the backward
  run.step(false);
  run.seq.forward(p.batches());  // a new routing: the backward's GEMM problems are stale again
  EXPECT_THROW(run.seq.grad_gemm0(0), InvalidArgument);
  run.team.synchronize();
}

}  // namespace
