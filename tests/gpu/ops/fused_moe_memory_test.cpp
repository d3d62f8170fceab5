// The fused layer's memory (issue 21): what it allocates is layer_footprint(); without training the
// expert outputs live in the gathered rows' memory; closing or destroying a layer gives every byte back;
// a rank that does not compute holds nothing private; load_factor sizes the rows for the expected load
// and a batch that needs more is refused, with NaN outputs, and the next one is right.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "comet/cuda_check.hpp"
#include "comet/footprint.hpp"
#include "comet/fused_moe.hpp"
#include "support/expect_invalid.hpp"
#include "support/test_layer.hpp"
#include "support/test_shapes.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

// An allocator that counts what the layer asks it for (its private buffers; the plan and the symmetric
// buffers come from cudaMalloc and the team).
struct CountingAllocator {
  std::shared_ptr<size_t> bytes = std::make_shared<size_t>(0);
  DeviceAllocator get() const {
    auto b = bytes;
    return DeviceAllocator{[b](size_t n) {
                             *b += n;
                             void* p = nullptr;
                             COMET_CUDA_CHECK(cudaMalloc(&p, n));
                             return p;
                           },
                           [](void* p) { cudaFree(p); }};
  }
};

size_t free_device_bytes() {
  size_t free = 0, total = 0;
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  COMET_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

TEST(FusedMoeMemory, FootprintIsWhatIsAllocated) {
  struct Config {
    MoeShape shape;
    Parallel par;
    Link link;
    bool training;
    MoeCapacity cap;
  };
  const std::vector<Config> configs = {
      {kSmallSwiglu, {4, 1}, Link::device, false, {300, 0, 0.0}},
      {kSmallSwiglu, {4, 1}, Link::host, true, {300, 0, 0.0}},
      {kTop8, {2, 2}, Link::device, false, {513, 0, 1.5}},
      {kTop8, {2, 2}, Link::device, true, {513, 1000, 0.0}},
      {kGelu, {1, 2}, Link::host, true, {77, 0, 2.0}},  // F/tp = 192 <= H: D lives in Y
      {MoeShape{256, 1024, 4, 1, Activation::silu}, {2, 1}, Link::device, true, {64, 0, 0.0}},  // F > H
  };
  for (const Config& c : configs) {
    const std::string what = "ep " + std::to_string(c.par.ep) + " tp " + std::to_string(c.par.tp) +
                             (c.training ? " training" : " inference") + " T " +
                             std::to_string(c.cap.max_tokens_per_rank);
    LocalTeam team(c.par.world(), c.link);
    const size_t symmetric_before = team.symmetric_bytes_in_use();
    CountingAllocator counter;
    MoeOptions o;
    o.training = c.training;
    o.allocator = counter.get();
    FusedMoe layer(team, c.shape, c.par, c.cap, o);
    const MoeCapacity resolved = resolve_capacity(c.shape, c.par, c.cap);
    EXPECT_EQ(layer.capacity().max_rows_per_rank, resolved.max_rows_per_rank) << what;
    const LayerFootprint f = layer_footprint(c.shape, c.par, resolved, c.training);
    EXPECT_EQ(layer.device_bytes_per_rank(), f.total()) << what;
    EXPECT_EQ(*counter.bytes, size_t(c.par.world()) * (f.compute() - f.plan)) << what << ": private buffers";
    EXPECT_EQ(team.symmetric_bytes_in_use() - symmetric_before, f.symmetric) << what << ": symmetric buffers";
    for (int r = 0; r < c.par.world(); ++r)
      EXPECT_EQ(c.training, layer.engine().expert_out(r) != layer.engine().gathered(r)) << what << " rank " << r;
  }
}

// Inference: Y is A's memory; the layer stays right across routings and token counts that change which
// rows of A layer 1 overwrites (poisoned between calls; one rank with no tokens, rows not a tile multiple).
TEST(FusedMoeMemory, SharedExpertOutputsStayRight) {
  LocalTeam team(4, Link::host);
  for (RoutingKind kind : {RoutingKind::uniform, RoutingKind::one_expert, RoutingKind::zipf}) {
    TestLayer l(team, kTop8, Parallel{2, 2}, {300, 0, 129, 77}, kind, 11);
    ASSERT_EQ(l.fused.engine().expert_out(0), l.fused.engine().gathered(0));
    for (int rep = 0; rep < 2; ++rep) {
      l.forward();
      l.expect_right("shared A/Y, routing " + std::to_string(int(kind)) + " call " + std::to_string(rep));
    }
  }
}

TEST(FusedMoeMemory, DestroyAndCloseGiveMemoryBack) {
  LocalTeam team(4, Link::device);
  const MoeShape big{1024, 2048, 8, 2, Activation::swiglu};
  const size_t symmetric_before = team.symmetric_bytes_in_use();
  const size_t free_before = free_device_bytes();
  size_t layer_bytes = 0;
  for (int i = 0; i < 4; ++i) {  // ~1.6 GB per layer: a leak would show as several GB
    FusedMoe layer(team, big, Parallel{4, 1}, MoeCapacity{16384, 0, 0.0});
    layer_bytes = layer.device_bytes_per_rank() * 4;
    EXPECT_LT(free_device_bytes() + layer_bytes / 2, free_before) << "the layer allocated less than it says";
  }
  EXPECT_EQ(team.symmetric_bytes_in_use(), symmetric_before);
  EXPECT_GT(free_device_bytes() + (64u << 20), free_before) << "destroyed layers kept memory ("
                                                            << layer_bytes / (1 << 20) << " MiB each)";
  // close(): everything given back at once, later calls refused, the team still serves new layers.
  {
    TestLayer l(team, kSmallSwiglu, Parallel{4, 1}, {90, 0, 130, 12}, RoutingKind::uniform, 5);
    l.forward();
    l.expect_right("before close");
    l.fused.close();
    EXPECT_EQ(team.symmetric_bytes_in_use(), symmetric_before);
    expect_invalid([&] { l.fused.forward(l.batches()); }, "closed");
    expect_invalid([&] { l.fused.engine().gathered(0); }, "closed");
    EXPECT_NO_THROW(l.fused.close());
    EXPECT_NO_THROW(l.fused.sync_and_check());
  }
  TestLayer again(team, kSmallSwiglu, Parallel{4, 1}, {90, 0, 130, 12}, RoutingKind::zipf, 6);
  again.forward();
  again.expect_right("a layer built after a closed one");
  expect_invalid([&] { team.local_ptr(SymmetricId{1}, 0); }, "was freed");  // the first layer's x buffer
}

// compute_ranks {0}: the other ranks stage their tokens only. Rank 0's hidden rows and expert outputs
// are bitwise those of a layer where every rank computes, and it allocates one rank's buffers.
TEST(FusedMoeMemory, OnlyComputeRanksHoldBuffers) {
  LocalTeam team(4, Link::host);
  const Parallel par{4, 1};
  TestLayer full(team, kTop8, par, {200, 57, 0, 311}, RoutingKind::uniform, 21);
  full.forward();
  full.expect_right("every rank computes");
  CountingAllocator counter;
  MoeOptions o;
  o.compute_ranks = {0};
  o.allocator = counter.get();
  FusedMoe one(team, kTop8, par, full.fused.capacity(), o);
  const LayerFootprint f = layer_footprint(kTop8, par, one.capacity(), false);
  EXPECT_EQ(*counter.bytes, f.compute() - f.plan) << "rank 0's private buffers only";
  for (int r = 0; r < 4; ++r) one.set_weights(r, full.ranks[r]->w0.get(), full.ranks[r]->w1.get());
  MoeEngine& e = one.engine();
  const auto batches = full.batches();
  for (int r = 0; r < 4; ++r) e.stage(r, batches[r]);
  team.barrier();
  e.prepare(0);
  e.layer0(0, LayerMode::fused, LayerRequest{});
  e.layer1(0, LayerMode::fused, LayerRequest{});
  one.sync_and_check();
  const HostPlan plan = e.plan(0).to_host(team.stream(0));
  const int rows = plan.view().expert_offset[plan.config().local_experts()];
  const int H = kTop8.hidden, Fs = par.ffn_shard(kTop8);
  const auto hid_one = download_bf16(e.hidden(0), size_t(rows) * Fs);
  const auto hid_full = download_bf16(full.fused.engine().hidden(0), size_t(rows) * Fs);
  const auto y_one = download_bf16(e.expert_out(0), size_t(rows) * H);
  const auto y_full = download_bf16(full.fused.engine().expert_out(0), size_t(rows) * H);
  int compared = 0;
  for (int row = 0; row < rows; ++row) {
    if (plan.view().row_unit[row] < 0) continue;
    ++compared;
    ASSERT_EQ(0, std::memcmp(&hid_one[size_t(row) * Fs], &hid_full[size_t(row) * Fs], size_t(Fs) * 2)) << row;
    ASSERT_EQ(0, std::memcmp(&y_one[size_t(row) * H], &y_full[size_t(row) * H], size_t(H) * 2)) << row;
  }
  EXPECT_GT(compared, 0);
  expect_invalid([&] { e.prepare(1); }, "does not compute");
  expect_invalid([&] { e.gathered(2); }, "does not compute");
  expect_invalid([&] { one.forward(batches); }, "does not compute");
  MoeOptions bad;
  bad.compute_ranks = {4};
  expect_invalid([&] { FusedMoe f(team, kTop8, par, full.fused.capacity(), bad); }, "compute_ranks");
}

// load_factor 1.5 at E 8, k 2, EP 4, T 256: mean W T k E_l / E = 4 * 256 * 2 * 2 / 8 = 512 rows, 768 +
// 2 * 127 padding = 1022, 1024 with the tile. Uniform batches fit (about 484 rows on a rank); every
// token's first slot on expert 0 does not (968 rows: 1024 with padding, and expert 1 has rows too).
TEST(FusedMoeMemory, LoadFactorSizesRowsAndRefusesOverload) {
  LocalTeam team(4, Link::device);
  team.set_timeout(3.0);
  const Parallel par{4, 1};
  TestLayer l(team, kSmallSwiglu, par, {256, 256, 200, 256}, RoutingKind::uniform, 8, {},
              MoeCapacity{0, 0, 1.5});
  EXPECT_EQ(l.fused.capacity().max_rows_per_rank, 1024);
  l.forward();
  l.expect_right("uniform batch within load_factor 1.5");
  const MoeProblem hot = MoeProblem::make(kSmallSwiglu, par, {256, 256, 200, 256}, RoutingKind::one_expert, 9);
  for (int r = 0; r < 4; ++r) {
    l.ranks[r]->ids.upload(hot.inputs[r].ids);
    l.ranks[r]->out.fill_bytes(0);
  }
  l.fused.forward(l.batches());
  try {
    l.fused.sync_and_check();
    ADD_FAILURE() << "a batch over the load factor's rows was not reported";
  } catch (const DeviceReportedError& e) {
    EXPECT_NE(std::string(e.what()).find("more than max_rows = 1024"), std::string::npos) << e.what();
  }
  // Rank 0 refused; the others must not sum its previous call's partials (kernels/peer_failure.hpp).
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(all_nan(l.ranks[r]->output())) << "rank " << r << " wrote numbers";
  for (int r = 0; r < 4; ++r) l.ranks[r]->ids.upload(l.problem.inputs[r].ids);
  l.forward();
  l.expect_right("after the refused batch");
}

}  // namespace
