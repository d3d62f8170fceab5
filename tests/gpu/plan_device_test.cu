// The device routing plan (DevicePlan) against the host plan, bitwise, every array at full capacity:
// random and adversarial routings over EP / TP / EP x TP layouts, routing buffers in device memory and
// in mapped pinned host memory, repeated builds on one plan, capture in a CUDA graph, bad routing
// (the first error named like the host names it, and an empty plan), checking mode, and a timing
// print for W = 8, T = 4096, k = 8, E_l = 32.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "comet/cuda_check.hpp"
#include "comet/device_plan.hpp"
#include "comet/plan.hpp"
#include "support/plan_configs.hpp"
#include "harness/routing_gen.hpp"

namespace comet {
namespace {

using testing::make_routing;
using testing::RankRouting;
using testing::RoutingKind;
using testing::views;
using testing::make_config;
using testing::worst_rows;
using testing::Layout;
using testing::layouts_of;

// W routing buffers (RoutingBufferLayout) in device memory or in mapped pinned host memory, and the
// device array of pointers that DevicePlan::build reads.
class RoutingBuffers {
 public:
  RoutingBuffers(int world, RoutingBufferLayout layout, bool mapped) : layout_(layout), mapped_(mapped) {
    for (int s = 0; s < world; ++s) {
      void* host = nullptr;
      void* dev = nullptr;
      if (mapped) {
        COMET_CUDA_CHECK(cudaHostAlloc(&host, layout.bytes(), cudaHostAllocMapped));
        COMET_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
      } else {
        COMET_CUDA_CHECK(cudaMalloc(&dev, layout.bytes()));
      }
      host_.push_back(host);
      dev_.push_back(dev);
    }
    COMET_CUDA_CHECK(cudaMalloc(&table_, sizeof(void*) * world));
    COMET_CUDA_CHECK(cudaMemcpy(table_, dev_.data(), sizeof(void*) * world, cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~RoutingBuffers() {
    for (size_t s = 0; s < dev_.size(); ++s) {
      if (mapped_) cudaFreeHost(host_[s]);
      else cudaFree(dev_[s]);
    }
    cudaFree(table_);
  }
  RoutingBuffers(const RoutingBuffers&) = delete;
  RoutingBuffers& operator=(const RoutingBuffers&) = delete;

  // The count word is written as given (it may be bad); ids and gates of at most max_tokens tokens.
  // Everything past the routing holds garbage (0xAB bytes: ids far out of range), which the builder
  // must never look at.
  void upload(const std::vector<RankRouting>& routing) {
    // A build on the tests' non-blocking stream may still be reading the previous routing: neither a
    // host memcpy into mapped memory nor a legacy-stream cudaMemcpy waits for it.
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    for (size_t s = 0; s < dev_.size(); ++s) {
      const RankRouting& r = routing[s];
      std::vector<char> staging(layout_.bytes(), char(0xAB));
      std::memcpy(staging.data(), &r.tokens, sizeof(int32_t));
      const size_t n = size_t(std::clamp(r.tokens, 0, layout_.max_tokens)) * layout_.topk;
      if (n > 0) {
        std::memcpy(staging.data() + layout_.ids_offset(), r.ids.data(), n * sizeof(int32_t));
        std::memcpy(staging.data() + layout_.gates_offset(), r.gates.data(), n * sizeof(float));
      }
      if (mapped_) std::memcpy(host_[s], staging.data(), staging.size());
      else COMET_CUDA_CHECK(cudaMemcpy(dev_[s], staging.data(), staging.size(), cudaMemcpyHostToDevice));
    }
    // ... and the build that follows on a non-blocking stream must not read before the copies land
    // (a pageable cudaMemcpy may return before its DMA completes).
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const void* const* table() const { return table_; }

 private:
  RoutingBufferLayout layout_;
  bool mapped_;
  std::vector<void*> host_, dev_;
  void** table_ = nullptr;
};

// The plan's arrays by name, for comparisons that say where they differ.
struct NamedArray {
  const char* name;
  const void* data;
  size_t count;
  bool is_float;
};

std::vector<NamedArray> arrays_of(const PlanConfig& cfg, const PlanView& v) {
  const size_t W = cfg.world(), El = cfg.local_experts(), k = cfg.topk();
  const size_t U = cfg.max_units(), R = cfg.cap.max_rows, M = cfg.max_tiles();
  return {{"status", v.status, size_t(kPlanStatusWords), false},
          {"first_error", v.first_error, size_t(kPlanStatusWords), false},
          {"src_tokens", v.src_tokens, W, false},
          {"expert_rows", v.expert_rows, El, false},
          {"expert_offset", v.expert_offset, El + 1, false},
          {"segment_offset", v.segment_offset, El * W, false},
          {"segment_rows", v.segment_rows, El * W, false},
          {"num_units", v.num_units, 1, false},
          {"num_local_units", v.num_local_units, 1, false},
          {"unit_src", v.unit_src, U, false},
          {"unit_token", v.unit_token, U, false},
          {"unit_rows", v.unit_rows, U * k, false},
          {"unit_gates", v.unit_gates, U * k, true},
          {"row_unit", v.row_unit, R, false},
          {"row_slot", v.row_slot, R, false},
          {"num_tiles", v.num_tiles, 1, false},
          {"tile_expert", v.tile_expert, M, false},
          {"tile_rows", v.tile_rows, M, false},
          {"tile_remote_rows", v.tile_remote_rows, M, false},
          {"tile_key", v.tile_key, M, false},
          {"tile_order", v.tile_order, M, false},
          {"pull_unit", v.pull_unit, U, false}};
}

// Bitwise equality of every array over its full capacity (status and first_error too unless skip_status).
void expect_same_plan(const HostPlan& expected, const HostPlan& actual, bool skip_status = false) {
  const auto want = arrays_of(expected.config(), expected.view());
  const auto got = arrays_of(actual.config(), actual.view());
  ASSERT_EQ(want.size(), got.size());
  for (size_t a = 0; a < want.size(); ++a) {
    if (skip_status && a < 2) continue;  // status and first_error
    const uint32_t* w = static_cast<const uint32_t*>(want[a].data);
    const uint32_t* g = static_cast<const uint32_t*>(got[a].data);
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < want[a].count; ++i) {
      if (w[i] != g[i] && mismatches++ == 0) first = i;
    }
    if (mismatches == 0) continue;
    if (want[a].is_float) {
      float fw, fg;
      std::memcpy(&fw, &w[first], 4);
      std::memcpy(&fg, &g[first], 4);
      ADD_FAILURE() << want[a].name << ": " << mismatches << " of " << want[a].count << " entries differ; first at ["
                    << first << "]: host " << fw << ", device " << fg;
    } else {
      ADD_FAILURE() << want[a].name << ": " << mismatches << " of " << want[a].count << " entries differ; first at ["
                    << first << "]: host " << int32_t(w[first]) << ", device " << int32_t(g[first]);
    }
  }
  if (!skip_status) {
    EXPECT_EQ(expected.bytes(), actual.bytes());
    EXPECT_EQ(0, std::memcmp(expected.view().status, actual.view().status, expected.bytes()))
        << "the blocks differ outside the arrays (alignment gaps)";
  }
}

std::vector<RankRouting> no_tokens(int W) {
  std::vector<RankRouting> r(W);
  return r;
}

std::string host_message(const PlanConfig& cfg, const std::vector<RankRouting>& routing) {
  try {
    build_plan_host(cfg, views(routing));
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

// Every test runs without checking mode (the lead may export COMET_CHECK=1 for the whole run), except
// where a test sets it itself.
class PlanDevice : public ::testing::Test {
 public:
  void SetUp() override {
    const char* v = std::getenv("COMET_CHECK");
    saved_ = v ? std::string(v) : std::string();
    had_ = v != nullptr;
    unsetenv("COMET_CHECK");
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (had_) setenv("COMET_CHECK", saved_.c_str(), 1);
    else unsetenv("COMET_CHECK");
    cudaStreamDestroy(stream_);
  }

  // Builds every rank's plan on the device and compares it with the host's.
  void expect_all_ranks_match(int ep, int tp, int E, int k, int tile_m, int max_tokens,
                              const std::vector<RankRouting>& routing, bool mapped, const std::string& what) {
    const int W = ep * tp;
    RoutingBuffers buffers(W, RoutingBufferLayout{max_tokens, k}, mapped);
    buffers.upload(routing);
    for (int rank = 0; rank < W; ++rank) {
      const int wave_chunk = 1 + rank % 3;  // the order kernel's chunked waves (plan.hpp) on every third rank
      // Pulls expert by expert (the pull kernels) on two ranks of every three, with and without chunks.
      const PullOrder pull_order = (rank + ep) % 3 != 1 ? PullOrder::expert : PullOrder::source;
      // On odd ranks a chunk rule (PlanConfig::chunk_rule), set after construction as the layer sets it
      // per batch: its expected rows put the ranks of a matrix in several load classes.
      const WaveChunkRule rule = rank % 2 ? WaveChunkRule{1.0 + rank * max_tokens * k / 8.0, {0, 2, 3, 5}}
                                          : WaveChunkRule{};
      SCOPED_TRACE(::testing::Message() << what << " W=" << W << " ep=" << ep << " tp=" << tp << " E=" << E << " k=" << k
                                        << " tile_m=" << tile_m << " T_cap=" << max_tokens << " rank=" << rank
                                        << " wave_chunk=" << wave_chunk << " rule expected_rows=" << rule.expected_rows
                                        << " pulls by " << (pull_order == PullOrder::expert ? "expert" : "source")
                                        << (mapped ? " mapped" : " device"));
      PlanConfig cfg = make_config(ep, tp, E, k, rank, tile_m, max_tokens, worst_rows(W, max_tokens, k, E / ep, tile_m));
      cfg.wave_chunk = wave_chunk;
      cfg.pull_order = pull_order;
      DevicePlan plan(cfg);
      cfg.chunk_rule = rule;
      const HostPlan expected = build_plan_host(cfg, views(routing));
      plan.set_wave_chunk_rule(rule);
      plan.build(buffers.table(), stream_);
      EXPECT_NO_THROW(plan.check(stream_));
      expect_same_plan(expected, plan.to_host(stream_));
      if (HasFailure()) return;
    }
  }

  cudaStream_t stream_ = nullptr;

 private:
  std::string saved_;
  bool had_ = false;
};

// Random token counts in [0, cap], with a rank of 0 tokens and one at capacity when W > 1.
std::vector<int> random_tokens(int W, int cap, uint64_t seed) {
  std::mt19937 rng(uint32_t(seed) * 2654435761u);
  std::vector<int> t(W);
  for (int& x : t) x = std::uniform_int_distribution<int>(0, cap)(rng);
  if (W > 1) {
    t[seed % W] = 0;
    t[(seed + 1) % W] = cap;
  }
  return t;
}

void run_matrix(PlanDevice* test, bool mapped, int max_tokens, const std::vector<int>& topks, int tile_m) {
  const int E = 16;
  const RoutingKind kinds[] = {RoutingKind::uniform, RoutingKind::zipf, RoutingKind::one_expert,
                               RoutingKind::local_only};
  uint64_t seed = mapped ? 1000 : 1;
  for (int W : {1, 2, 4, 8}) {
    for (const Layout& lay : layouts_of(W)) {
      for (int k : topks) {
        for (RoutingKind kind : kinds) {
          ++seed;
          if (kind == RoutingKind::local_only && E / lay.ep < k) continue;  // needs k experts in the group
          const auto routing = make_routing(MoeShape{64, 128, E, k, Activation::swiglu}, Parallel{lay.ep, lay.tp},
                                            random_tokens(W, max_tokens, seed), kind, seed, int(seed % E));
          test->expect_all_ranks_match(lay.ep, lay.tp, E, k, tile_m, max_tokens, routing, mapped, testing::to_string(kind));
          if (test->HasFailure()) return;
        }
      }
    }
  }
}

// T_cap = 300: two chunks of the count kernel, the second partial.
TEST_F(PlanDevice, MatchesHostOnRandomRoutings) { run_matrix(this, false, 300, {1, 2, 8}, 64); }
TEST_F(PlanDevice, MatchesHostOnRandomRoutingsTinyTiles) { run_matrix(this, false, 100, {2, 8}, 16); }
TEST_F(PlanDevice, MatchesHostWithMappedHostRouting) { run_matrix(this, true, 300, {1, 2, 8}, 128); }

TEST_F(PlanDevice, MatchesHostOnAdversarialRoutings) {
  for (bool mapped : {false, true}) {
    // Every token's first slot to expert 0, all at capacity over several chunks, k = 8.
    {
      const MoeShape shape{64, 128, 16, 8, Activation::swiglu};
      const auto r = make_routing(shape, Parallel{4, 1}, {700, 700, 700, 700}, RoutingKind::one_expert, 5, 0);
      expect_all_ranks_match(4, 1, 16, 8, 128, 700, r, mapped, "hot expert");
    }
    // Nobody has tokens.
    expect_all_ranks_match(2, 2, 8, 2, 64, 64, no_tokens(4), mapped, "no tokens");
    // T_cap * k not a multiple of 4: the gates are not 16-byte aligned (word-by-word copy path).
    for (int k : {1, 2, 3}) {
      const MoeShape shape{64, 128, 8, k, Activation::swiglu};
      const auto r = make_routing(shape, Parallel{2, 1}, {301, 257}, RoutingKind::uniform, 6 + k);
      expect_all_ranks_match(2, 1, 8, k, 64, 301, r, mapped, "unaligned gates");
    }
    // Many local experts (TP: E_l = E): 256, and the limit 1024.
    for (int E : {256, 1024}) {
      const MoeShape shape{64, 128, E, 2, Activation::swiglu};
      const auto r = make_routing(shape, Parallel{1, 2}, {500, 333}, RoutingKind::zipf, 7);
      expect_all_ranks_match(1, 2, E, 2, 64, 500, r, mapped, "many experts");
    }
    // Largest top-k, tile_m = 256, and every token of a rank at the capacity of several chunks.
    {
      const MoeShape shape{64, 128, 32, kMaxTopK, Activation::swiglu};
      const auto r = make_routing(shape, Parallel{2, 2}, {513, 0, 1, 512}, RoutingKind::uniform, 8);
      expect_all_ranks_match(2, 2, 32, kMaxTopK, 256, 513, r, mapped, "k = 16");
    }
    // Row counts exactly at tile multiples: 64 tokens of each rank to experts {0, 1} (k = 2, E = 4).
    {
      std::vector<RankRouting> r(2);
      for (auto& rank : r) {
        rank.tokens = 64;
        for (int t = 0; t < 64; ++t) {
          rank.ids.insert(rank.ids.end(), {0, 1});
          rank.gates.insert(rank.gates.end(), {0.5f, 0.5f});
        }
      }
      expect_all_ranks_match(2, 1, 4, 2, 64, 64, r, mapped, "full tiles");
    }
    if (HasFailure()) return;
  }
}

TEST_F(PlanDevice, LargeCapacityMatchesHost) {
  const MoeShape shape{64, 128, 64, 8, Activation::swiglu};
  const auto r = make_routing(shape, Parallel{4, 2}, random_tokens(8, 4096, 77), RoutingKind::zipf, 77);
  expect_all_ranks_match(4, 2, 64, 8, 128, 4096, r, false, "large");
}

TEST_F(PlanDevice, RepeatedBuildsHaveNoStaleState) {
  const int W = 4, E = 16, k = 2, cap = 600;
  const MoeShape shape{64, 128, E, k, Activation::swiglu};
  const PlanConfig cfg = make_config(4, 1, E, k, 1, 64, cap, worst_rows(W, cap, k, E / 4, 64));
  const auto a = make_routing(shape, Parallel{4, 1}, {600, 599, 300, 1}, RoutingKind::uniform, 21);
  const auto b = make_routing(shape, Parallel{4, 1}, {5, 0, 17, 260}, RoutingKind::zipf, 22);
  auto bad = a;
  bad[0].ids[3] = E;
  RoutingBuffers buffers(W, RoutingBufferLayout{cap, k}, false);
  DevicePlan plan(cfg);
  const HostPlan host_a = build_plan_host(cfg, views(a)), host_b = build_plan_host(cfg, views(b));

  buffers.upload(a);
  plan.build(buffers.table(), stream_);
  expect_same_plan(host_a, plan.to_host(stream_));
  plan.build(buffers.table(), stream_);  // same input again
  expect_same_plan(host_a, plan.to_host(stream_));
  buffers.upload(b);  // fewer units, rows and tiles: nothing of a may survive
  plan.build(buffers.table(), stream_);
  expect_same_plan(host_b, plan.to_host(stream_));
  buffers.upload(bad);
  plan.build(buffers.table(), stream_);
  EXPECT_THROW(plan.check(stream_), DeviceReportedError);
  buffers.upload(a);  // the error must not stick
  plan.build(buffers.table(), stream_);
  EXPECT_NO_THROW(plan.check(stream_));
  expect_same_plan(host_a, plan.to_host(stream_));

  // A moved plan keeps working.
  DevicePlan moved = std::move(plan);
  buffers.upload(b);
  moved.build(buffers.table(), stream_);
  expect_same_plan(host_b, moved.to_host(stream_));
}

TEST_F(PlanDevice, CapturesInACudaGraph) {
  const int W = 8, E = 32, k = 8, cap = 1024;
  const MoeShape shape{64, 128, E, k, Activation::swiglu};
  const PlanConfig cfg = make_config(8, 1, E, k, 3, 128, cap, worst_rows(W, cap, k, E / 8, 128));
  RoutingBuffers buffers(W, RoutingBufferLayout{cap, k}, false);
  DevicePlan plan(cfg);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  COMET_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  plan.build(buffers.table(), stream_);
  COMET_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  COMET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t seed : {31, 32, 33}) {
    const auto r = make_routing(shape, Parallel{8, 1}, random_tokens(W, cap, seed), RoutingKind::uniform, seed);
    buffers.upload(r);
    COMET_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    expect_same_plan(build_plan_host(cfg, views(r)), plan.to_host(stream_));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// ---- bad routing -------------------------------------------------------------------------------

struct BadCase {
  const char* what;
  void (*spoil)(std::vector<RankRouting>&);
  int max_rows;  // 0: enough for anything
  PlanError code;
};

TEST_F(PlanDevice, BadRoutingNamesTheFirstErrorAndEmptiesThePlan) {
  // W = 4 (EP), E = 8, k = 2, 20 tokens per rank: as in the CPU test.
  const int W = 4, E = 8, k = 2, cap = 20;
  const MoeShape shape{64, 128, E, k, Activation::swiglu};
  using Routing = std::vector<RankRouting>;
  const BadCase cases[] = {
      {"out of range", [](Routing& r) { r[2].ids[17 * 2 + 1] = 9; }, 0, PlanError::expert_out_of_range},
      {"negative", [](Routing& r) { r[0].ids[0] = -1; }, 0, PlanError::expert_out_of_range},
      {"very negative", [](Routing& r) { r[3].ids[19 * 2 + 1] = INT32_MIN; }, 0, PlanError::expert_out_of_range},
      {"duplicate", [](Routing& r) { r[1].ids[5 * 2 + 1] = r[1].ids[5 * 2]; }, 0, PlanError::duplicate_expert},
      {"NaN gate", [](Routing& r) { r[2].gates[6 * 2 + 1] = std::numeric_limits<float>::quiet_NaN(); }, 0,
       PlanError::gate_not_finite},
      {"inf gate after a duplicate",
       [](Routing& r) {
         r[0].gates[3 * 2] = std::numeric_limits<float>::infinity();  // rank 0, token 3, slot 0: the first
         r[0].ids[4 * 2 + 1] = r[0].ids[4 * 2];                       // rank 0, token 4, slot 1
       },
       0, PlanError::gate_not_finite},
      {"too many tokens", [](Routing& r) { r[3].tokens = 21; }, 0, PlanError::tokens_over_capacity},
      {"negative tokens", [](Routing& r) { r[1].tokens = -3; }, 0, PlanError::tokens_over_capacity},
      {"first of several",
       [](Routing& r) {
         r[3].ids[0] = 99;             // rank 3, token 0, slot 0
         r[1].ids[5 * 2 + 1] = -5;     // rank 1, token 5, slot 1: the first
         r[1].ids[7 * 2] = 77;         // rank 1, token 7, slot 0
         r[2].ids[1] = r[2].ids[0];    // rank 2, token 0, slot 1 (duplicate)
       },
       0, PlanError::expert_out_of_range},
      {"tokens before ids",
       [](Routing& r) {
         r[0].ids[0] = 99;
         r[2].tokens = 30;
       },
       0, PlanError::tokens_over_capacity},
      {"too many rows",  // every token of every rank to experts {0, 1}: 128 + 128 padded rows on rank 0
       [](Routing& r) {
         for (auto& rank : r) {
           for (int t = 0; t < rank.tokens; ++t) {
             rank.ids[t * 2] = 0;
             rank.ids[t * 2 + 1] = 1;
           }
         }
       },
       64, PlanError::rows_over_capacity},
  };
  for (bool mapped : {false, true}) {
    for (const BadCase& c : cases) {
      auto routing = make_routing(shape, Parallel{4, 1}, {20, 20, 20, 20}, RoutingKind::uniform, 11);
      c.spoil(routing);
      RoutingBuffers buffers(W, RoutingBufferLayout{cap, k}, mapped);
      buffers.upload(routing);
      for (int rank = 0; rank < W; ++rank) {
        SCOPED_TRACE(::testing::Message() << c.what << " rank=" << rank << (mapped ? " mapped" : " device"));
        const int max_rows = c.max_rows ? c.max_rows : worst_rows(W, cap, k, E / 4, 64);
        const PlanConfig cfg = make_config(4, 1, E, k, rank, 64, cap, max_rows);
        if (c.code == PlanError::rows_over_capacity && rank != 0) continue;  // only rank 0 holds experts 0 and 1
        const std::string expected_message = host_message(cfg, routing);
        ASSERT_NE(expected_message, "(no error)");
        DevicePlan plan(cfg);
        plan.build(buffers.table(), stream_);
        try {
          plan.check(stream_);
          ADD_FAILURE() << "check() did not throw; expected: " << expected_message;
        } catch (const DeviceReportedError& e) {
          EXPECT_EQ(std::string(e.what()), expected_message);
        }
        const HostPlan got = plan.to_host(stream_);
        EXPECT_EQ(got.view().status[0], int32_t(c.code));
        // Empty: no units, rows or tiles, every array as if nobody had tokens.
        expect_same_plan(build_plan_host(cfg, views(no_tokens(W))), got, /*skip_status=*/true);
      }
    }
  }
}

TEST_F(PlanDevice, CheckingModeThrowsFromBuild) {
  const int W = 2, E = 4, k = 2, cap = 8;
  const MoeShape shape{64, 128, E, k, Activation::swiglu};
  auto routing = make_routing(shape, Parallel{2, 1}, {8, 8}, RoutingKind::uniform, 3);
  const PlanConfig cfg = make_config(2, 1, E, k, 0, 64, cap, 256);
  RoutingBuffers buffers(W, RoutingBufferLayout{cap, k}, false);
  DevicePlan plan(cfg);
  setenv("COMET_CHECK", "1", 1);
  buffers.upload(routing);
  EXPECT_NO_THROW(plan.build(buffers.table(), stream_));
  routing[1].ids[7 * 2 + 1] = 4;
  buffers.upload(routing);
  try {
    plan.build(buffers.table(), stream_);
    ADD_FAILURE() << "build() in checking mode did not throw";
  } catch (const DeviceReportedError& e) {
    EXPECT_EQ(std::string(e.what()), "routing: expert id 4 out of range [0, 4) at rank 1, token 7, slot 1");
  }
  unsetenv("COMET_CHECK");
  EXPECT_NO_THROW(plan.build(buffers.table(), stream_));  // not checking: no throw, the status holds it
  EXPECT_THROW(plan.check(stream_), DeviceReportedError);
}

// An error is kept until a check reads it: later good builds do not overwrite it (the empty plan of
// the failed build is the only trace otherwise), and a check clears it for the next one.
TEST_F(PlanDevice, FirstErrorIsStickyUntilChecked) {
  const int W = 2, E = 4, k = 2, cap = 8;
  const MoeShape shape{64, 128, E, k, Activation::swiglu};
  const auto good = make_routing(shape, Parallel{2, 1}, {8, 8}, RoutingKind::uniform, 3);
  auto bad = good, worse = good;
  bad[1].ids[7 * 2 + 1] = 4;
  worse[0].ids[2 * 2 + 0] = -3;
  const PlanConfig cfg = make_config(2, 1, E, k, 0, 64, cap, 256);
  RoutingBuffers buffers(W, RoutingBufferLayout{cap, k}, false);
  DevicePlan plan(cfg);
  buffers.upload(bad);
  plan.build(buffers.table(), stream_);
  buffers.upload(worse);
  plan.build(buffers.table(), stream_);  // a second error: the first one stays
  buffers.upload(good);
  plan.build(buffers.table(), stream_);  // a good build: the plan is right again, the error stays
  expect_same_plan(build_plan_host(cfg, views(good)), plan.to_host(stream_), /*skip_status=*/true);
  try {
    plan.check(stream_);
    ADD_FAILURE() << "check() did not report the first error";
  } catch (const DeviceReportedError& e) {
    EXPECT_EQ(std::string(e.what()), "routing: expert id 4 out of range [0, 4) at rank 1, token 7, slot 1");
  }
  EXPECT_NO_THROW(plan.check(stream_));  // read once: cleared
  buffers.upload(worse);
  plan.build(buffers.table(), stream_);
  try {
    plan.check(stream_);
    ADD_FAILURE() << "check() did not report the next error";
  } catch (const DeviceReportedError& e) {
    EXPECT_EQ(std::string(e.what()), "routing: expert id -3 out of range [0, 4) at rank 0, token 2, slot 0");
  }
}

// ---- timing (printed, not asserted) ------------------------------------------------------------

TEST_F(PlanDevice, BuildTiming) {
  const int W = 8, E = 256, k = 8, cap = 4096, tile_m = 128;  // E_l = 32
  const MoeShape shape{64, 128, E, k, Activation::swiglu};
  const auto routing = make_routing(shape, Parallel{8, 1}, std::vector<int>(W, cap), RoutingKind::uniform, 99);
  const PlanConfig cfg = make_config(8, 1, E, k, 0, tile_m, cap, worst_rows(W, cap, k, E / 8, tile_m));
  cudaEvent_t start, stop;
  COMET_CUDA_CHECK(cudaEventCreate(&start));
  COMET_CUDA_CHECK(cudaEventCreate(&stop));
  const int iters = 200;
  for (bool mapped : {false, true}) {
    RoutingBuffers buffers(W, RoutingBufferLayout{cap, k}, mapped);
    buffers.upload(routing);
    DevicePlan plan(cfg);
    for (int i = 0; i < 20; ++i) plan.build(buffers.table(), stream_);
    COMET_CUDA_CHECK(cudaEventRecord(start, stream_));
    for (int i = 0; i < iters; ++i) plan.build(buffers.table(), stream_);
    COMET_CUDA_CHECK(cudaEventRecord(stop, stream_));
    COMET_CUDA_CHECK(cudaEventSynchronize(stop));
    float stream_ms = 0;
    COMET_CUDA_CHECK(cudaEventElapsedTime(&stream_ms, start, stop));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    COMET_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    plan.build(buffers.table(), stream_);
    COMET_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    COMET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 20; ++i) COMET_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    COMET_CUDA_CHECK(cudaEventRecord(start, stream_));
    for (int i = 0; i < iters; ++i) COMET_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    COMET_CUDA_CHECK(cudaEventRecord(stop, stream_));
    COMET_CUDA_CHECK(cudaEventSynchronize(stop));
    float graph_ms = 0;
    COMET_CUDA_CHECK(cudaEventElapsedTime(&graph_ms, start, stop));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    const HostPlan got = plan.to_host(stream_);
    expect_same_plan(build_plan_host(cfg, views(routing)), got);
    std::printf("[plan timing] W=%d T=%d k=%d E_l=%d tile_m=%d routing in %s: %.2f us/build (stream), %.2f us/build "
                "(graph); units %d, rows %d, tiles %d\n",
                W, cap, k, E / 8, tile_m, mapped ? "mapped host memory" : "device memory", 1000.0f * stream_ms / iters,
                1000.0f * graph_ms / iters, *got.view().num_units, got.view().expert_offset[E / 8],
                *got.view().num_tiles);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace
}  // namespace comet
