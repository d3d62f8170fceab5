// The child role of comet_ipc_tests: one rank of an IpcTeam. Every step is bounded (alarm(), the
// rendezvous' deadlines, bounded device waits), so a broken peer ends this process instead of hanging.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdlib>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "comet/cuda_check.hpp"
#include "comet/team.hpp"
#include "ipc/ipc_cases.hpp"
#if COMET_IPC_FUSED
#include "ipc/ops/ipc_fused.hpp"
#endif
#include "harness/socket_rendezvous.hpp"
#include "support/team_exchange.hpp"

namespace comet::ipc_test {
namespace {

constexpr size_t kSlice = 4099;  // uint32 words per source rank
constexpr int kTimeoutSignal = Team::kNumSignals - 1;  // never set by anyone

class Checks {
 public:
  Checks(int rank, int world) : rank_(rank), world_(world) {}
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    ++failures_;
    std::fprintf(stderr, "[ipc world=%d rank %d] FAILED: %s\n", world_, rank_, what.c_str());
  }
  void note(const std::string& what) const {
    std::fprintf(stderr, "[ipc world=%d rank %d] %s\n", world_, rank_, what.c_str());
  }
  int failures() const { return failures_; }

 private:
  int rank_, world_, failures_ = 0;
};

template <class Exception, class F>
bool throws(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Exception& e) {
    if (message) *message = e.what();
    return true;
  } catch (...) {
    return false;
  }
  return false;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

uint64_t read_word(const uint64_t* p) {
  uint64_t v = 0;
  COMET_CUDA_CHECK(cudaMemcpy(&v, p, sizeof(v), cudaMemcpyDefault));
  return v;
}

// Arguments that must be refused before anything collective happens (so no rank waits on another).
void check_bad_construction(int rank, int world, const AllGatherFn& gather, Checks& c) {
  c.expect(throws<InvalidArgument>([&] { IpcTeam t(rank, 0, gather); }), "world 0 accepted");
  c.expect(throws<InvalidArgument>([&] { IpcTeam t(world, world, gather); }), "rank == world accepted");
  c.expect(throws<InvalidArgument>([&] { IpcTeam t(-1, world, gather); }), "rank -1 accepted");
  c.expect(throws<InvalidArgument>([&] { IpcTeam t(rank, world, AllGatherFn{}); }), "empty all_gather accepted");
  int count = 0;
  COMET_CUDA_CHECK(cudaGetDeviceCount(&count));
  c.expect(throws<InvalidArgument>([&] { IpcTeam t(rank, world, gather, count); }), "device out of range accepted");
}

void check_tables(IpcTeam& team, SymmetricId buf, Checks& c) {
  const int rank = team.rank(), world = team.world();
  c.expect(team.local_ranks() == std::vector<int>{rank}, "local_ranks() is not {rank}");
  c.expect(team.symmetric_bytes(buf) == comet::testing::pattern_buffer_bytes(world, kSlice), "symmetric_bytes");
  c.expect(team.peer_ptr(buf, rank, rank) == team.local_ptr(buf, rank), "own entry of the peer table");
  std::vector<void*> table(world);
  COMET_CUDA_CHECK(cudaMemcpy(table.data(), team.peer_ptrs(buf, rank), world * sizeof(void*), cudaMemcpyDeviceToHost));
  for (int p = 0; p < world; ++p) {
    c.expect(table[p] == team.peer_ptr(buf, rank, p), "device peer table differs at peer " + std::to_string(p));
    if (p != rank) c.expect(table[p] != team.local_ptr(buf, rank), "peer " + std::to_string(p) + " maps to own copy");
  }
  if (world > 1) {
    const int other = (rank + 1) % world;
    c.expect(throws<InvalidArgument>([&] { team.local_ptr(buf, other); }), "local_ptr of a remote rank accepted");
    c.expect(throws<InvalidArgument>([&] { team.stream(other); }), "stream of a remote rank accepted");
    c.expect(throws<InvalidArgument>([&] { team.signal_wait(other, 0, 1); }), "signal_wait for a remote rank");
  }
  c.expect(throws<InvalidArgument>([&] { team.alloc_symmetric(0); }), "alloc_symmetric(0) accepted");
  c.expect(read_word(team.signal_ptr(rank, rank, kTimeoutSignal)) == 0, "signal words not zero-initialised");
}

void check_round(IpcTeam& team, SymmetricId buf, uint32_t gen, Checks& c) {
  const comet::testing::PatternCheck r = comet::testing::exchange_round(team, buf, kSlice, gen);
  c.expect(r.mismatches == 0, "round " + std::to_string(gen) + ": " + r.first);
  for (int s = 0; s < team.world(); ++s) {
    c.expect(read_word(team.signal_ptr(team.rank(), team.rank(), s)) >= gen,
             "signal from rank " + std::to_string(s) + " below round " + std::to_string(gen));
  }
}

void check_timeout(IpcTeam& team, Checks& c) {
  const int rank = team.rank();
  team.set_timeout(0.2);
  team.signal_wait(rank, kTimeoutSignal, uint64_t(1) << 40);
  std::string message;
  const bool timed_out = throws<TimeoutError>([&] { team.synchronize(); }, &message);
  c.expect(timed_out, "synchronize() did not raise TimeoutError for a signal nobody sets");
  if (timed_out) {
    const std::string who = "rank " + std::to_string(rank) + ":";
    c.expect(contains(message, who) && contains(message, "signal " + std::to_string(kTimeoutSignal)) &&
                 contains(message, "saw 0"),
             "timeout message lacks rank / signal / value: " + message);
  }
  team.clear_status(rank);
  c.expect(!throws<TimeoutError>([&] { team.check(rank); }), "status still set after clear_status");
  team.set_timeout(kDeviceTimeoutS);
}

// The barrier keeps its epoch on the device, so a captured barrier replays correctly and mixes with
// direct ones. (Every rank replays the same number of times.)
void check_graph_barrier(IpcTeam& team, Checks& c) {
  cudaStream_t s = team.stream(team.rank());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  COMET_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    team.barrier();
  } catch (...) {
    cudaStreamEndCapture(s, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  COMET_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  COMET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) COMET_CUDA_CHECK(cudaGraphLaunch(exec, s));
  std::string message;
  c.expect(!throws<TimeoutError>([&] { team.synchronize(); }, &message), "graph-replayed barrier: " + message);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

int run_checks(int rank, int world, comet::testing::SocketRendezvous& rv, Checks& c) {
  check_bad_construction(rank, world, rv.all_gather_fn(), c);
  {
    IpcTeam team(rank, world, rv.all_gather_fn(), 0, heap_from_env());
    team.set_timeout(kDeviceTimeoutS);
    const SymmetricId buf = team.alloc_symmetric(comet::testing::pattern_buffer_bytes(world, kSlice));
    check_tables(team, buf, c);

    const comet::testing::PatternCheck zero = comet::testing::check_pattern(team, buf, kSlice, 0);
    c.expect(zero.mismatches == 0, "fresh buffer not zero: " + zero.first);
    team.barrier();  // nobody writes into a copy that is still being checked for zeros
    team.synchronize();

    check_round(team, buf, 1, c);
    check_round(team, buf, 2, c);
    check_timeout(team, c);
    check_graph_barrier(team, c);
    check_round(team, buf, 3, c);  // the team works again after the timeout and the graph replays
    team.synchronize();
#if COMET_IPC_FUSED
    const std::string fused = check_fused_layer(team);
    c.expect(fused.empty(), fused);
#endif
    team.close();  // collective: every rank is done with every peer's memory before any is freed
    c.expect(throws<InvalidArgument>([&] { team.barrier(); }), "barrier on a closed team accepted");
  }
  rv.barrier();
  return c.failures();
}

// NVSHMEM's heap with no pointer to any peer (COMET_NVSHMEM_PEER_POINTERS=0), as across nodes: the
// peer tables hold null, the signals and the barrier are NVSHMEM signal operations (graph replays and
// timeouts included), and a fused layer runs with transport nvshmem only.
int run_unmapped(int rank, int world, comet::testing::SocketRendezvous& rv, Checks& c) {
  setenv("COMET_NVSHMEM_PEER_POINTERS", "0", 1);
  IpcTeam team(rank, world, rv.all_gather_fn(), 0, SymmetricHeap::nvshmem);
  team.set_timeout(kDeviceTimeoutS);
  c.expect(!team.maps_peers(), "maps_peers() with COMET_NVSHMEM_PEER_POINTERS=0");
  const SymmetricId buf = team.alloc_symmetric(4096);
  c.expect(team.peer_ptr(buf, rank, rank) == team.local_ptr(buf, rank), "own entry of the peer table");
  for (int p = 0; p < world; ++p) {
    if (p == rank) continue;
    c.expect(team.peer_ptr(buf, rank, p) == nullptr, "peer " + std::to_string(p) + " has a pointer");
    c.expect(team.signal_ptr(rank, p, 0) == nullptr, "peer " + std::to_string(p) + "'s signal word has a pointer");
  }
  // Three rounds: every rank raises word [rank] of every peer to the round, waits for its own words, and
  // meets the others.
  constexpr uint64_t kRounds = 3;
  for (uint64_t gen = 1; gen <= kRounds; ++gen) {
    for (int d = 0; d < world; ++d)
      if (d != rank) team.signal_set(rank, d, rank, gen);
    for (int s = 0; s < world; ++s)
      if (s != rank) team.signal_wait(rank, s, gen);
    team.barrier();
  }
  std::string message;
  c.expect(!throws<TimeoutError>([&] { team.synchronize(); }, &message), "signal rounds over NVSHMEM: " + message);
  for (int s = 0; s < world; ++s)
    if (s != rank)
      c.expect(read_word(team.signal_ptr(rank, rank, s)) == kRounds, "word of rank " + std::to_string(s) + " after " +
                                                                         std::to_string(kRounds) + " rounds");
  check_timeout(team, c);
  check_graph_barrier(team, c);
  team.barrier();
  team.synchronize();
#if COMET_IPC_FUSED
  const std::string fused = check_unmapped_fused_layer(team);
  c.expect(fused.empty(), fused);
#endif
  team.close();
  rv.barrier();
  return c.failures();
}

// A dead or absent peer (the last rank) in a forward, then the collective teardown.
int run_dead_peer(int rank, int world, comet::testing::SocketRendezvous& rv, bool killed, Checks& c) {
#if COMET_IPC_FUSED
  IpcTeam team(rank, world, rv.all_gather_fn(), 0, heap_from_env());
  team.set_timeout(kDeviceTimeoutS);
  const std::string e = check_dead_peer(team, killed, [&] { rv.barrier(); });
  c.expect(e.empty(), e);
#else
  (void)rank, (void)world, (void)rv, (void)killed;
  c.note("dead-peer case needs the fused kernels (COMET_BUILD_KERNELS)");
#endif
  return c.failures();
}

}  // namespace

int run_rank(int rank, int world, const std::string& socket_path, const std::string& which) {
  ::alarm(kChildAlarmS);
  Checks c(rank, world);
  try {
    if (which == "absent_peer" || which == "killed_peer") {
      // Short deadlines: against a dead peer the rendezvous must fail in seconds.
      comet::testing::SocketRendezvous rv(socket_path, rank, world, 15.0);
      return run_dead_peer(rank, world, rv, which == "killed_peer", c) == 0 ? 0 : 1;
    }
    comet::testing::SocketRendezvous rv(socket_path, rank, world, 60.0);
    if (which == "unmapped") return run_unmapped(rank, world, rv, c) == 0 ? 0 : 1;
    const int failures = run_checks(rank, world, rv, c);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    c.expect(false, std::string("exception: ") + e.what());
    return 2;
  }
}

}  // namespace comet::ipc_test
