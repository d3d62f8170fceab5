// A peer that dies or never comes, across processes (issue 18). Every rank runs one right forward
// first; then the last rank either never calls the second forward (absent: it sleeps, then comes to
// the teardown) or dies in the middle of it (killed: SIGKILL after its layer-0 launch). The others
// must get a TimeoutError naming their rank and what they waited for, within a bounded time, with NaN
// in their outputs (never stale sums); then IpcTeam::close: it completes when the absent peer comes,
// and raises (after releasing the buffers) when the peer is dead.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>

#include "comet/fused_moe.hpp"
#include "comet/reference.hpp"
#include "harness/moe_problem.hpp"
#include "ipc/ops/ipc_fused.hpp"

namespace comet::ipc_test {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

std::string check_dead_peer(IpcTeam& team, bool killed, const std::function<void()>& host_barrier) {
  using namespace comet::testing;
  const int rank = team.rank(), W = team.world(), victim = W - 1;
  constexpr double kTimeoutS = 2.0;   // the bound of every device wait in this case
  constexpr double kSlackS = 8.0;     // the error must come within kTimeoutS + kSlackS
  const std::string who = std::string(killed ? "killed" : "absent") + " peer, rank " + std::to_string(rank) + ": ";
  const MoeShape shape{1024, 512, 8, 2, Activation::swiglu};
  const Parallel par{W, 1};
  const IpcLayer l = make_ipc_layer(team, shape, par, std::vector<int>(W, 200), RoutingKind::uniform, 31);
  const MoeProblem& p = l.problem;
  FusedMoe& moe = *l.moe;
  const auto& mine = l.mine;

  // One right call with everyone: the setup works.
  moe.forward({mine->batch()});
  moe.sync_and_check();
  const auto ref = reference::forward(shape, par, p.weights, p.inputs);
  if (!(relative_error(mine->output(), ref[rank]) < 1.5e-2)) return who + "the first (good) call is wrong";
  team.barrier();
  team.synchronize();
  host_barrier();
  team.set_timeout(kTimeoutS);

  if (rank == victim) {
    if (killed) {
      moe.forward_layer0({mine->batch()});
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // its kernels are on the GPU
      ::kill(::getpid(), SIGKILL);
    }
    // Absent: never makes the call; comes to the teardown once the others have timed out.
    std::this_thread::sleep_for(std::chrono::duration<double>(kTimeoutS + 4.0));
  } else {
    mine->out.fill_bytes(0);  // a failed call must write NaN itself
    const auto t0 = Clock::now();
    moe.forward({mine->batch()});
    std::string error;
    try {
      moe.sync_and_check();
    } catch (const TimeoutError& e) {
      error = e.what();
    }
    const double waited = seconds_since(t0);
    std::fprintf(stderr, "[ipc dead peer] %s%.2f s to the error: %s\n", who.c_str(), waited, error.c_str());
    if (error.empty()) return who + "no TimeoutError although rank " + std::to_string(victim) + " never finished";
    if (waited > kTimeoutS + kSlackS) return who + "the error took " + std::to_string(waited) + " s";
    if (error.find("rank " + std::to_string(rank) + ":") == std::string::npos || error.find("waiting for") == std::string::npos)
      return who + "the error does not name the rank and what it waited for: " + error;
    for (float v : mine->output())
      if (!std::isnan(v)) return who + "the failed call's output is not all NaN";
  }

  // Teardown: collective; against a dead peer it must end (with an error), not hang.
  const auto t1 = Clock::now();
  std::string closing;
  try {
    team.close();
  } catch (const TimeoutError& e) {
    closing = e.what();
  }
  std::fprintf(stderr, "[ipc dead peer] %sclose() took %.2f s%s%s\n", who.c_str(), seconds_since(t1),
               closing.empty() ? "" : ": ", closing.c_str());
  if (!killed && !closing.empty()) return who + "close() failed although every peer came: " + closing;
  if (killed && closing.empty()) return who + "close() did not report the dead peer";
  try {
    moe.forward({mine->batch()});
    return who + "a forward on a closed team was accepted";
  } catch (const InvalidArgument&) {
  }
  return "";
}

}  // namespace comet::ipc_test
