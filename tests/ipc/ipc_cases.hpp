// comet_ipc_tests: one executable that plays two roles. Run plainly, it is the parent: it spawns one
// child process per rank (fork + exec of itself, with the rank in the environment), bounds and reaps
// them, and reports one line per case. Run with COMET_IPC_RANK set, it is one rank of a case.
#pragma once

#include <cstdlib>
#include <string>

#include "comet/common.hpp"
#include "comet/fused_moe.hpp"
#include "comet/team.hpp"

namespace comet::ipc_test {

inline constexpr const char* kEnvRank = "COMET_IPC_RANK";
inline constexpr const char* kEnvWorld = "COMET_IPC_WORLD";
inline constexpr const char* kEnvSocket = "COMET_IPC_SOCKET";
inline constexpr const char* kEnvCase = "COMET_IPC_CASE";  // team (default), absent_peer, killed_peer, unmapped

inline constexpr const char* kEnvHeap = "COMET_IPC_HEAP";  // cuda_ipc (default) or nvshmem: every case's team

inline SymmetricHeap heap_from_env() {
  const char* v = std::getenv(kEnvHeap);
  return v && *v ? parse_heap(v) : SymmetricHeap::cuda_ipc;
}

// peer (default) or nvshmem: the fused-layer cases' MoeOptions::transport (the fp8 layer 0's too).
// nvshmem needs COMET_IPC_HEAP=nvshmem.
inline constexpr const char* kEnvTransport = "COMET_IPC_TRANSPORT";

inline DeviceTransport transport_from_env() {
  const char* v = std::getenv(kEnvTransport);
  if (!v || !*v || std::string(v) == "peer") return DeviceTransport::peer;
  if (std::string(v) == "nvshmem") return DeviceTransport::nvshmem;
  throw InvalidArgument(std::string(kEnvTransport) + " must be peer or nvshmem, got '" + v + "'");
}

inline constexpr int kSkipExitCode = 77;      // CTest's SKIP_RETURN_CODE
inline constexpr unsigned kChildAlarmS = 150;  // a child that is still alive then is killed by SIGALRM
inline constexpr double kCaseDeadlineS = 180;  // the parent kills whatever is left of a case then
inline constexpr double kFailureGraceS = 30;   // after one rank fails, how long the others may take
inline constexpr double kDeviceTimeoutS = 20;  // bounded device waits inside the children

// The child role: one rank of an IpcTeam case. Returns the process exit code (0: every check passed).
int run_rank(int rank, int world, const std::string& socket_path, const std::string& which);

// Creates a CUDA context and returns 0, kSkipExitCode when there is no GPU, 1 when CUDA fails.
// Runs in its own process (the parent must not initialise CUDA before it forks).
int probe_gpu();

}  // namespace comet::ipc_test
