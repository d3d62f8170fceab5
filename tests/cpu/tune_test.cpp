// The tuner's pieces on the CPU: keys, the persisted table, the cost model and the selection.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "comet/tune.hpp"

using namespace comet;

namespace {

TuneKey key_for(int layer, int tokens) {
  TuneKey k;
  k.gpu = "NVIDIA H200";
  k.sms = 132;
  k.layer = layer;
  k.hidden = 4096;
  k.ffn = 14336;
  k.experts = 8;
  k.topk = 2;
  k.world = 8;
  k.ep = 8;
  k.tp = 1;
  k.link = Link::host;
  k.tokens_bucket = tokens_bucket(tokens);
  return k;
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("comet_tune_test_") + name)).string();
}

}  // namespace

TEST(TuneKey, CanonicalAndBucketed) {
  EXPECT_EQ(tokens_bucket(1), 256);
  EXPECT_EQ(tokens_bucket(256), 256);
  EXPECT_EQ(tokens_bucket(257), 512);
  EXPECT_EQ(tokens_bucket(16384), 16384);
  EXPECT_EQ(key_for(0, 3000).str(), "NVIDIA H200|132|l0|4096x14336|E8|k2|W8|ep8|tp1|host|T4096|bf16");
  EXPECT_EQ(key_for(1, 4096).str(), key_for(1, 3000).str());
  EXPECT_NE(key_for(0, 4096).str(), key_for(1, 4096).str());
}

TEST(TuneTable, SavesAndLoadsEntriesAndModels) {
  const std::string path = temp_path("roundtrip.json");
  TuneTable t;
  t.put(key_for(0, 4096), TuneEntry{LayerVariant{256, 4, 2, 1}, 2.71});
  t.put(key_for(1, 4096), TuneEntry{LayerVariant{128, 8, 0, 2}, 1.5});
  CostModel m;
  m.gemm_tflops_per_sm = 5.25;
  m.l0_row_us = 0.5;
  m.l1_row_us = 0.9;
  m.link_gbps = 47;
  m.overlap_penalty = 0.25;
  t.set_model("NVIDIA H200", Link::host, m);
  t.save(path);
  const TuneTable u = TuneTable::load(path);
  ASSERT_EQ(u.size(), 2u);
  const TuneEntry* e = u.find(key_for(1, 4000));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->variant.tile_n, 128);
  EXPECT_EQ(e->variant.n_comm, 8);
  EXPECT_EQ(e->variant.n_group, 2);
  EXPECT_DOUBLE_EQ(e->ms, 1.5);
  EXPECT_EQ(u.find(key_for(1, 8192)), nullptr);
  const CostModel v = u.model("NVIDIA H200", Link::host);
  EXPECT_DOUBLE_EQ(v.l0_row_us, 0.5);
  EXPECT_DOUBLE_EQ(v.l1_row_us, 0.9);
  EXPECT_DOUBLE_EQ(v.link_gbps, 47);
  EXPECT_DOUBLE_EQ(v.overlap_penalty, 0.25);
  EXPECT_DOUBLE_EQ(u.model("other", Link::host).l0_row_us, CostModel::defaults(Link::host).l0_row_us);
  std::filesystem::remove(path);
}

TEST(TuneTable, MissingFileIsEmptyCorruptFileIsAnError) {
  EXPECT_EQ(TuneTable::load(temp_path("does_not_exist.json")).size(), 0u);
  const std::string path = temp_path("corrupt.json");
  std::ofstream(path) << "{ not json";
  EXPECT_THROW(TuneTable::load(path), InvalidArgument);
  std::filesystem::remove(path);
}

TEST(TuneTable, DefaultPathFollowsTheEnvironment) {
  setenv("COMET_TUNE_TABLE", "/x/y.json", 1);
  EXPECT_EQ(TuneTable::default_path(), "/x/y.json");
  unsetenv("COMET_TUNE_TABLE");
  setenv("XDG_CACHE_HOME", "/cache", 1);
  EXPECT_EQ(TuneTable::default_path(), "/cache/comet/tune.json");
  unsetenv("XDG_CACHE_HOME");
}

TEST(CostModel, MoreBytesPerFlopAsksForMoreCommBlocks) {
  const CostModel m = CostModel::defaults(Link::host);
  LayerWork w{0, 2e12, 0, 0, 1};
  int last = 0;
  for (double rows : {1e2, 1e3, 4e3, 8e3, 2e4}) {  // same GEMM, more and more 8 KB rows to pull
    w.link_rows = rows;
    w.link_bytes = rows * 8192;
    const int n = m.best_n_comm(w, 132);
    EXPECT_GE(n, last) << rows;
    last = n;
  }
  EXPECT_GT(last, 2);
  // Smaller rows cost a block the same time each: the same bytes in 4 KB rows never need fewer blocks,
  // and a block's predicted transfer takes twice as long.
  LayerWork small{0, 2e11, 8e3 * 4096, 8e3, 1}, large{0, 2e11, 4e3 * 8192, 4e3, 1};
  EXPECT_GE(m.best_n_comm(small, 132), m.best_n_comm(large, 132));
  LayerWork small_comm = small, large_comm = large;
  small_comm.flops = large_comm.flops = 0;
  EXPECT_NEAR(m.predict_ms(small_comm, 1, 132) / m.predict_ms(large_comm, 1, 132), 2.0, 0.05);
  // Nothing to move: the fewest blocks.
  EXPECT_EQ(m.best_n_comm(LayerWork{1, 1e12, 0, 0, 16}, 132), 2);
}

TEST(CostModel, PredictionIsTheLongerSideWhenOneDominates) {
  const CostModel m = CostModel::defaults(Link::host);
  const LayerWork gemm_bound{0, 5e12, 1e6, 122, 1};
  const double gemm = 5e12 / (m.gemm_tflops_per_sm * 1e12 * 130) * 1e3;
  EXPECT_NEAR(m.predict_ms(gemm_bound, 2, 132), gemm, gemm * 0.05);
  // Far past the per-block rates, the link's ceiling decides.
  const LayerWork comm_bound{1, 1e9, 4.6e8, 4.6e8 / 8192, 16};
  EXPECT_NEAR(m.predict_ms(comm_bound, 32, 132), 4.6e8 / (m.link_gbps * 1e9) * 1e3, 0.6);
}

TEST(ExpectedWork, FollowsTheLayout) {
  const MoeShape s{4096, 14336, 8, 2, Activation::swiglu};
  const LayerWork ep = expected_work(s, Parallel{8, 1}, 0, 4096, 256);
  const LayerWork tp = expected_work(s, Parallel{1, 8}, 0, 4096, 256);
  // Same flops per rank (each rank does 1/8 of the work), but TP moves every token to every rank.
  EXPECT_NEAR(ep.flops / tp.flops, 1.0, 1e-9);
  EXPECT_GT(tp.link_bytes, 3 * ep.link_bytes);
  EXPECT_EQ(expected_work(s, Parallel{8, 1}, 1, 4096, 256).column_groups, 16);
}

TEST(PickVariant, TableFirstThenCostModel) {
  TuneTable t;
  t.put(key_for(0, 4096), TuneEntry{LayerVariant{128, 7, 0, 1}, 1.0});
  const LayerWork w = expected_work(MoeShape{4096, 14336, 8, 2, Activation::swiglu}, Parallel{8, 1}, 0, 4096, 256);
  const TunedVariant hit = pick_variant(t, key_for(0, 4096), w, LayerVariant{256, -1, 0, 1});
  EXPECT_STREQ(hit.picked_by, "table");
  EXPECT_EQ(hit.variant.n_comm, 7);
  EXPECT_EQ(hit.variant.tile_n, 128);
  const TunedVariant miss = pick_variant(t, key_for(0, 16384), w, LayerVariant{256, -1, 3, 1});
  EXPECT_STREQ(miss.picked_by, "cost_model");
  EXPECT_GE(miss.variant.n_comm, 1);
  EXPECT_EQ(miss.variant.m_group, 3);
}
