// Several NVSHMEM PEs as processes of one executable, for the probe and the tests that need more than
// one PE without MPI or a launcher. Run plainly, the executable is the parent: spawn_pes re-executes it
// once per PE with the PE in the environment (kEnvPe) and a file path for the unique id (kEnvIdPath),
// bounds each child with an alarm, reaps them and reports the ones that failed. In a child, pe_from_env
// says which PE it is, and share_bytes hands PE 0's unique id (any bytes) to the others through the file.
// Header-only and free of NVSHMEM's headers: the callers own the NVSHMEM calls.
#pragma once

#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

// A CUDA call in a PE process: on failure, names the PE and the call and ends the process (exit 3,
// which spawn_pes reports).
#define COMET_PE_CUDA(pe, call)                                                                       \
  do {                                                                                                \
    const cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "pe %d: %s failed: %s\n", (pe), #call, cudaGetErrorString(e_));            \
      std::exit(3);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace comet::harness {

inline constexpr const char* kEnvPe = "COMET_NVSHMEM_PE";
inline constexpr const char* kEnvIdPath = "COMET_NVSHMEM_ID";

// This process's PE when it is a child of spawn_pes, else -1.
inline int pe_from_env() {
  const char* v = std::getenv(kEnvPe);
  return v ? std::atoi(v) : -1;
}
inline std::string id_path_from_env() {
  const char* v = std::getenv(kEnvIdPath);
  return v ? v : "";
}

// Runs `pes` copies of this executable (same arguments), one per PE, each ended by SIGALRM after
// alarm_s seconds. Prints one line per child that did not exit with 0; returns how many did not.
inline int spawn_pes(int pes, char** argv, unsigned alarm_s) {
  const std::string path = "/tmp/comet_pes_" + std::to_string(getpid()) + ".id";
  std::remove(path.c_str());
  std::vector<pid_t> kids;
  for (int pe = 0; pe < pes; ++pe) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv(kEnvPe, std::to_string(pe).c_str(), 1);
      setenv(kEnvIdPath, path.c_str(), 1);
      alarm(alarm_s);  // a PE stuck inside NVSHMEM ends here
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    kids.push_back(pid);
  }
  int failed = 0;
  for (int pe = 0; pe < pes; ++pe) {
    int status = 0;
    if (kids[pe] < 0 || waitpid(kids[pe], &status, 0) < 0) {
      std::printf("PE %d could not be started or reaped\n", pe);
      ++failed;
      continue;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    ++failed;
    if (WIFSIGNALED(status))
      std::printf("PE %d ended by signal %d%s\n", pe, WTERMSIG(status), WTERMSIG(status) == SIGALRM ? " (hung)" : "");
    else
      std::printf("PE %d exit %d\n", pe, WEXITSTATUS(status));
  }
  std::remove(path.c_str());
  return failed;
}

// PE 0 fills `bytes` with make() and writes them to `path` (atomically: a temporary file, renamed);
// every other PE reads them from there, waiting up to timeout_s. False if make() failed or the file
// did not come.
inline bool share_bytes(int pe, const std::string& path, void* bytes, size_t n, const std::function<bool()>& make,
                        int timeout_s = 30) {
  if (pe == 0) {
    if (!make()) return false;
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(static_cast<const char*>(bytes), std::streamsize(n));
    return std::rename(tmp.c_str(), path.c_str()) == 0;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(static_cast<char*>(bytes), std::streamsize(n))) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace comet::harness
