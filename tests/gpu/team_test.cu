// Team substrate on the GPU: LocalTeam's symmetric buffers, signals, barrier, bounded waits and
// argument checks. (IpcTeam runs the same exchange in tests/ipc, one process per rank.)
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "comet/cuda_check.hpp"
#include "comet/team.hpp"
#include "support/team_exchange.hpp"

namespace {

using comet::InvalidArgument;
using comet::Link;
using comet::LocalTeam;
using comet::SymmetricId;
using comet::Team;
using comet::TimeoutError;
using comet::WaitSite;

constexpr size_t kSlice = 4099;  // words per (source rank) slice; odd, so no kernel gets an even split

uint64_t read_word(const uint64_t* p) {
  uint64_t v = 0;
  COMET_CUDA_CHECK(cudaMemcpy(&v, p, sizeof(v), cudaMemcpyDefault));
  return v;
}

// ---- names -------------------------------------------------------------------------------------------

TEST(TeamNames, LinkRoundTripsAndRejectsUnknown) {
  EXPECT_STREQ(comet::to_string(Link::device), "device");
  EXPECT_STREQ(comet::to_string(Link::host), "host");
  EXPECT_EQ(comet::parse_link("device"), Link::device);
  EXPECT_EQ(comet::parse_link("host"), Link::host);
  EXPECT_THROW(comet::parse_link("pcie"), InvalidArgument);
  EXPECT_THROW(comet::parse_link(""), InvalidArgument);
}

TEST(TeamNames, WaitSites) {
  EXPECT_STREQ(comet::to_string(WaitSite::signal), "signal");
  EXPECT_STREQ(comet::to_string(WaitSite::barrier), "barrier");
  EXPECT_STREQ(comet::to_string(WaitSite::tile_ready), "tile_ready");
  EXPECT_STREQ(comet::to_string(WaitSite::tile_done), "tile_done");
}

// ---- exchange over W virtual ranks, both links ----------------------------------------------------------

class LocalTeamExchange : public ::testing::TestWithParam<std::tuple<int, Link>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  Link link() const { return std::get<1>(GetParam()); }
};

TEST_P(LocalTeamExchange, StreamsAndViewsPerRank) {
  LocalTeam team(world(), link());
  EXPECT_EQ(team.world(), world());
  EXPECT_EQ(team.link(), link());
  EXPECT_EQ(team.local_ranks().size(), static_cast<size_t>(world()));
  std::vector<cudaStream_t> seen;
  for (int r = 0; r < world(); ++r) {
    EXPECT_TRUE(team.is_local(r));
    cudaStream_t s = team.stream(r);
    ASSERT_NE(s, nullptr);
    unsigned flags = 0;
    COMET_CUDA_CHECK(cudaStreamGetFlags(s, &flags));
    EXPECT_EQ(flags & cudaStreamNonBlocking, cudaStreamNonBlocking) << "rank " << r;
    for (cudaStream_t other : seen) EXPECT_NE(s, other);
    seen.push_back(s);
    const comet::TeamDeviceView v = team.device_view(r);
    EXPECT_EQ(v.rank, r);
    EXPECT_EQ(v.world, world());
    ASSERT_NE(v.status, nullptr);
    EXPECT_EQ(v.timeout_ns, uint64_t(10) * 1000 * 1000 * 1000);
  }
  EXPECT_FALSE(team.is_local(world()));
  team.set_timeout(0.5);
  EXPECT_EQ(team.device_view(0).timeout_ns, uint64_t(500) * 1000 * 1000);
  EXPECT_DOUBLE_EQ(team.timeout(), 0.5);
}

TEST_P(LocalTeamExchange, FreshBuffersAndSignalsAreZero) {
  LocalTeam team(world(), link());
  const SymmetricId buf = team.alloc_symmetric(comet::testing::pattern_buffer_bytes(world(), kSlice));
  const comet::testing::PatternCheck zero = comet::testing::check_pattern(team, buf, kSlice, 0);
  EXPECT_EQ(zero.mismatches, 0u) << zero.first;
  for (int r = 0; r < world(); ++r) {
    for (int id : {0, 1, Team::kNumSignals - 1}) EXPECT_EQ(read_word(team.signal_ptr(r, r, id)), 0u);
  }
}

TEST_P(LocalTeamExchange, PeerTablesAgreeAndLiveWhereTheLinkSays) {
  LocalTeam team(world(), link());
  const size_t bytes = comet::testing::pattern_buffer_bytes(world(), kSlice);
  const SymmetricId a = team.alloc_symmetric(bytes);
  const SymmetricId b = team.alloc_symmetric(64);
  EXPECT_NE(a.id, b.id);
  EXPECT_EQ(team.symmetric_bytes(a), bytes);
  EXPECT_EQ(team.symmetric_bytes(b), 64u);
  for (int r = 0; r < world(); ++r) {
    std::vector<void*> table(world());
    COMET_CUDA_CHECK(cudaMemcpy(table.data(), team.peer_ptrs(a, r), world() * sizeof(void*), cudaMemcpyDeviceToHost));
    for (int p = 0; p < world(); ++p) {
      // One process: every rank addresses peer p's copy as p itself does.
      EXPECT_EQ(team.peer_ptr(a, r, p), team.local_ptr(a, p)) << "rank " << r << " peer " << p;
      EXPECT_EQ(table[p], team.peer_ptr(a, r, p)) << "device table of rank " << r << ", peer " << p;
      EXPECT_EQ(team.signal_ptr(r, p, 3), team.signal_ptr(p, p, 3));
      if (p != r) EXPECT_NE(team.local_ptr(a, r), team.local_ptr(a, p));
    }
    cudaPointerAttributes attr{};
    COMET_CUDA_CHECK(cudaPointerGetAttributes(&attr, team.local_ptr(a, r)));
    EXPECT_EQ(attr.type, link() == Link::host ? cudaMemoryTypeHost : cudaMemoryTypeDevice) << "rank " << r;
  }
}

TEST_P(LocalTeamExchange, TwoRoundsWithGenerationCounters) {
  LocalTeam team(world(), link());
  const SymmetricId buf = team.alloc_symmetric(comet::testing::pattern_buffer_bytes(world(), kSlice));
  for (uint32_t gen = 1; gen <= 2; ++gen) {
    const comet::testing::PatternCheck r = comet::testing::exchange_round(team, buf, kSlice, gen);
    EXPECT_EQ(r.mismatches, 0u) << "round " << gen << ": " << r.first;
    // Every peer's signal to every rank carries this round's generation: no reset between rounds.
    for (int d = 0; d < world(); ++d) {
      for (int s = 0; s < world(); ++s) EXPECT_EQ(read_word(team.signal_ptr(d, d, s)), gen) << d << " <- " << s;
    }
  }
}

std::string exchange_name(const ::testing::TestParamInfo<std::tuple<int, Link>>& info) {
  return "W" + std::to_string(std::get<0>(info.param)) + "_" + comet::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllWorlds, LocalTeamExchange,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8), ::testing::Values(Link::device, Link::host)),
                         exchange_name);

// ---- barrier ordering -----------------------------------------------------------------------------------

// Spins for `ns` before writing, so that without the barrier the readers would run first.
__global__ void delayed_store_kernel(uint32_t* const* peers, int world, uint32_t value, uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  for (int p = 0; p < world; ++p) peers[p][0] = value;
}

__global__ void copy_word_kernel(const uint32_t* from, uint32_t* to) { *to = *from; }

class LocalTeamBarrier : public ::testing::TestWithParam<Link> {};

TEST_P(LocalTeamBarrier, OrdersASlowWriterBeforeEveryReader) {
  constexpr int W = 4;
  LocalTeam team(W, GetParam());
  const SymmetricId buf = team.alloc_symmetric(sizeof(uint32_t));
  uint32_t* seen = nullptr;
  COMET_CUDA_CHECK(cudaMalloc(&seen, W * sizeof(uint32_t)));
  COMET_CUDA_CHECK(cudaMemset(seen, 0, W * sizeof(uint32_t)));
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  for (uint32_t round = 1; round <= 2; ++round) {
    const int writer = static_cast<int>(round) % W;
    delayed_store_kernel<<<1, 1, 0, team.stream(writer)>>>(
        reinterpret_cast<uint32_t* const*>(team.peer_ptrs(buf, writer)), W, 100 + round, 50u * 1000 * 1000);
    COMET_CUDA_CHECK_LAUNCH();
    team.barrier();
    for (int r = 0; r < W; ++r) {
      copy_word_kernel<<<1, 1, 0, team.stream(r)>>>(static_cast<const uint32_t*>(team.local_ptr(buf, r)), seen + r);
      COMET_CUDA_CHECK_LAUNCH();
    }
    team.barrier();  // the next round's writer must not overtake these reads
    team.synchronize();
    std::vector<uint32_t> got(W);
    COMET_CUDA_CHECK(cudaMemcpy(got.data(), seen, W * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    for (int r = 0; r < W; ++r) EXPECT_EQ(got[r], 100 + round) << "round " << round << ", rank " << r;
  }
  cudaFree(seen);
}

INSTANTIATE_TEST_SUITE_P(BothLinks, LocalTeamBarrier, ::testing::Values(Link::device, Link::host),
                         [](const auto& info) { return std::string(comet::to_string(info.param)); });

// ---- signals: reset and bounded waits --------------------------------------------------------------------

class LocalTeamSignals : public ::testing::TestWithParam<Link> {};

TEST_P(LocalTeamSignals, ResetReturnsTheWordToZero) {
  LocalTeam team(2, GetParam());
  team.signal_set(0, 1, 3, 42);
  team.barrier();
  team.signal_wait(1, 3, 42);
  team.signal_reset(1, 3);
  team.signal_wait(1, 3, 0);  // >= 0 holds at once
  team.synchronize();
  EXPECT_EQ(read_word(team.signal_ptr(1, 1, 3)), 0u);
  EXPECT_EQ(read_word(team.signal_ptr(0, 0, 3)), 0u);  // rank 0's own word was never touched
}

TEST_P(LocalTeamSignals, TimeoutNamesRankSignalAndValueThenRecovers) {
  LocalTeam team(2, GetParam());
  team.set_timeout(0.2);
  team.signal_set(0, 1, 5, 3);
  team.barrier();
  const auto start = std::chrono::steady_clock::now();
  team.signal_wait(1, 5, 7);    // nobody ever sets 7: times out
  team.signal_wait(1, 9, 100);  // gives up at once (the rank is aborted); the first failure is reported
  std::string message;
  try {
    team.synchronize();
    ADD_FAILURE() << "synchronize() did not throw";
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(elapsed, 0.15);
  EXPECT_LT(elapsed, 5.0) << "the second wait should not have waited its own full timeout";
  EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
  EXPECT_NE(message.find("signal 5"), std::string::npos) << message;
  EXPECT_NE(message.find(">= 7"), std::string::npos) << message;
  EXPECT_NE(message.find("saw 3"), std::string::npos) << message;
  EXPECT_NE(message.find("0.20 s"), std::string::npos) << message;
  EXPECT_EQ(message.find("rank 0"), std::string::npos) << "rank 0 did not fail: " << message;

  EXPECT_NO_THROW(team.check(0));
  EXPECT_THROW(team.check(1), TimeoutError);  // the status stays until cleared
  team.clear_status(1);
  EXPECT_NO_THROW(team.check(1));

  // The team works again.
  team.set_timeout(10.0);
  const SymmetricId buf = team.alloc_symmetric(comet::testing::pattern_buffer_bytes(2, kSlice));
  const comet::testing::PatternCheck r = comet::testing::exchange_round(team, buf, kSlice, 1, /*first_signal=*/16);
  EXPECT_EQ(r.mismatches, 0u) << r.first;
  team.signal_set(0, 1, 5, 7);
  team.barrier();  // no rank's kernel waits on another rank's kernel (DESIGN.md section 6)
  team.signal_wait(1, 5, 7);
  EXPECT_NO_THROW(team.synchronize());
}

INSTANTIATE_TEST_SUITE_P(BothLinks, LocalTeamSignals, ::testing::Values(Link::device, Link::host),
                         [](const auto& info) { return std::string(comet::to_string(info.param)); });

// ---- argument checks ------------------------------------------------------------------------------------

TEST(LocalTeamArguments, BadConstructionThrowsInvalidArgument) {
  EXPECT_THROW(LocalTeam(0), InvalidArgument);
  EXPECT_THROW(LocalTeam(-3), InvalidArgument);
  EXPECT_THROW(LocalTeam(2, static_cast<Link>(7)), InvalidArgument);
  int count = 0;
  COMET_CUDA_CHECK(cudaGetDeviceCount(&count));
  EXPECT_THROW(LocalTeam(2, Link::device, count), InvalidArgument);
  EXPECT_THROW(LocalTeam(2, Link::device, -1), InvalidArgument);
}

TEST(LocalTeamArguments, BadCallsThrowInvalidArgument) {
  LocalTeam team(2);
  const SymmetricId buf = team.alloc_symmetric(256);
  EXPECT_THROW(team.alloc_symmetric(0), InvalidArgument);
  EXPECT_THROW(team.stream(2), InvalidArgument);
  EXPECT_THROW(team.stream(-1), InvalidArgument);
  EXPECT_THROW(team.device_view(2), InvalidArgument);
  EXPECT_THROW(team.local_ptr(buf, 2), InvalidArgument);
  EXPECT_THROW(team.local_ptr(SymmetricId{}, 0), InvalidArgument);
  EXPECT_THROW(team.local_ptr(SymmetricId{buf.id + 100}, 0), InvalidArgument);
  EXPECT_THROW(team.peer_ptrs(buf, -1), InvalidArgument);
  EXPECT_THROW(team.peer_ptr(buf, 0, 2), InvalidArgument);
  EXPECT_THROW(team.symmetric_bytes(SymmetricId{}), InvalidArgument);
  EXPECT_THROW(team.signal_ptr(0, 0, Team::kNumSignals), InvalidArgument);
  EXPECT_THROW(team.signal_set(0, 2, 0, 1), InvalidArgument);
  EXPECT_THROW(team.signal_set(0, 1, -1, 1), InvalidArgument);
  EXPECT_THROW(team.signal_wait(2, 0, 1), InvalidArgument);
  EXPECT_THROW(team.signal_wait(0, Team::kNumSignals, 1), InvalidArgument);
  EXPECT_THROW(team.signal_reset(0, 64), InvalidArgument);
  EXPECT_THROW(team.set_timeout(0.0), InvalidArgument);
  EXPECT_THROW(team.set_timeout(-1.0), InvalidArgument);
  EXPECT_THROW(team.set_timeout(std::nan("")), InvalidArgument);
  EXPECT_THROW(team.check(2), InvalidArgument);
  EXPECT_THROW(team.clear_status(-1), InvalidArgument);
  try {
    team.signal_set(0, 1, 70, 1);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("signal id 70"), std::string::npos) << e.what();
  }
  // Nothing above was enqueued: the team is untouched.
  EXPECT_NO_THROW(team.synchronize());
}

}  // namespace
