// Entry point of comet_ipc_tests and its parent role: runs each IpcTeam case as W child processes
// of this executable (several ranks share one GPU; under MPS they run concurrently), bounds them in
// time, and prints one line per case and a summary "N passed, M failed".
//
// The parent never initialises CUDA: a process that forks after creating a CUDA context hands its
// children a broken one. Even the GPU check runs in a child (--probe).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ipc/ipc_cases.hpp"

namespace comet::ipc_test {
namespace {

using Clock = std::chrono::steady_clock;
using Env = std::vector<std::pair<std::string, std::string>>;

// fork + exec of this executable with extra arguments and environment. The child dies with the
// parent (PR_SET_PDEATHSIG survives exec), so an interrupted run leaves no rank spinning on the GPU.
pid_t spawn_self(const std::vector<std::string>& args, const Env& env) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return -1;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (const auto& [key, value] : env) ::setenv(key.c_str(), value.c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>("comet_ipc_tests"));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    std::perror("execv /proc/self/exe");
    ::_exit(127);
  }
  return pid;
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "ended with status " + std::to_string(status);
}

struct Child {
  pid_t pid = -1;
  bool done = false;
  int status = 0;
  bool ok() const { return done && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

// Reaps `children`; kills the rest when the deadline passes, or `grace_s` after the first failure.
void reap(std::vector<Child>& children, double deadline_s, double grace_s) {
  const auto start = Clock::now();
  Clock::time_point give_up = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(deadline_s));
  bool failure_seen = false;
  for (;;) {
    bool all_done = true;
    for (Child& c : children) {
      if (c.done) continue;
      if (c.pid < 0) {
        c.done = true;
        c.status = 127 << 8;
        continue;
      }
      if (::waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
        c.done = true;
      } else {
        all_done = false;
      }
    }
    if (all_done) return;
    for (Child& c : children) {
      if (c.done && !c.ok() && !failure_seen) {
        failure_seen = true;
        const auto grace = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
        if (grace < give_up) give_up = grace;
      }
    }
    if (Clock::now() > give_up) {
      for (Child& c : children) {
        if (c.done) continue;
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &c.status, 0);
        c.done = true;
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// 0: GPU usable, kSkipExitCode: none, else: broken.
int probe_in_child() {
  std::vector<Child> probe(1);
  probe[0].pid = spawn_self({"--probe"}, {});
  reap(probe, 60, 0);
  if (WIFEXITED(probe[0].status)) return WEXITSTATUS(probe[0].status);
  std::printf("gpu probe %s\n", describe_exit(probe[0].status).c_str());
  return 1;
}

struct CaseResult {
  bool passed = false;
  std::string detail;
};

// which: "team" (the team and the fused layer), "absent_peer" or "killed_peer" (the last rank never
// comes to a forward / dies in one; it is expected to end by SIGKILL in the second).
CaseResult run_case(int world, const std::string& which) {
  const std::string socket = "/tmp/comet-ipc-" + std::to_string(::getpid()) + "-" + which + "-w" +
                             std::to_string(world) + ".sock";
  std::vector<Child> children(world);
  for (int r = 0; r < world; ++r) {
    children[r].pid = spawn_self({}, {{kEnvRank, std::to_string(r)},
                                      {kEnvWorld, std::to_string(world)},
                                      {kEnvSocket, socket},
                                      {kEnvCase, which}});
  }
  // A killed rank is the case's own doing: no grace period that would cut the others short.
  reap(children, kCaseDeadlineS, which == "killed_peer" ? kCaseDeadlineS : kFailureGraceS);
  ::unlink(socket.c_str());  // in case rank 0 died before removing it
  CaseResult result{true, ""};
  for (int r = 0; r < world; ++r) {
    const Child& c = children[r];
    if (which == "killed_peer" && r == world - 1) {
      if (c.done && WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL) continue;
    } else if (c.ok()) {
      continue;
    }
    result.passed = false;
    result.detail += (result.detail.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " " +
                                                             describe_exit(children[r].status));
  }
  return result;
}

int run_parent() {
  const int probe = probe_in_child();
  if (probe == kSkipExitCode) {
    std::printf("skipped: no GPU (comet_ipc_tests needs a CUDA device; run scripts/gpu-test there)\n");
    return kSkipExitCode;
  }
  if (probe != 0) {
    std::printf("FAIL gpu probe: CUDA is present but unusable (exit %d)\n0 passed, 1 failed\n", probe);
    return 1;
  }
  int passed = 0, failed = 0;
  std::printf("symmetric heap: %s\n", to_string(heap_from_env()));
  std::vector<std::pair<std::string, int>> cases{{"team", 2},        {"team", 4},        {"team", 8},
                                                 {"absent_peer", 2}, {"absent_peer", 4}, {"killed_peer", 2},
                                                 {"killed_peer", 4}};
  // NVSHMEM's heap and transport: the team again without peer pointers, as across nodes.
  if (heap_from_env() == SymmetricHeap::nvshmem && transport_from_env() == DeviceTransport::nvshmem) {
    cases.push_back({"unmapped", 2});
    cases.push_back({"unmapped", 4});
  }
  const char* only = std::getenv("COMET_IPC_ONLY");  // e.g. COMET_IPC_ONLY=killed_peer
  for (const auto& [which, world] : cases) {
    if (only && *only && which != only) continue;
    const auto start = Clock::now();
    const CaseResult r = run_case(world, which);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    const char* name = which == "team" ? "ipc_team" : which.c_str();
    if (r.passed) {
      ++passed;
      std::printf("PASS %s world=%d (%.1f s)\n", name, world, s);
    } else {
      ++failed;
      std::printf("FAIL %s world=%d (%.1f s): %s\n", name, world, s, r.detail.c_str());
    }
    std::fflush(stdout);
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

int parse_env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (*end == '\0' && x >= 0 && x < 1 << 20) ? static_cast<int>(x) : -1;
}

}  // namespace
}  // namespace comet::ipc_test

int main(int argc, char** argv) {
  using namespace comet::ipc_test;
  if (argc > 1 && std::strcmp(argv[1], "--probe") == 0) return probe_gpu();
  if (std::getenv(kEnvRank)) {
    const int rank = parse_env_int(kEnvRank);
    const int world = parse_env_int(kEnvWorld);
    const char* socket = std::getenv(kEnvSocket);
    if (rank < 0 || world < 1 || rank >= world || !socket) {
      std::fprintf(stderr, "comet_ipc_tests: bad %s / %s / %s in the environment\n", kEnvRank, kEnvWorld, kEnvSocket);
      return 2;
    }
    const char* which = std::getenv(kEnvCase);
    return run_rank(rank, world, socket, which && *which ? which : "team");
  }
  if (argc > 1) {
    std::fprintf(stderr, "usage: comet_ipc_tests [--probe]\n");
    return 2;
  }
  return run_parent();
}
