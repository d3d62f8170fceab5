// NVSHMEM's symmetric heap as an IpcTeam's memory (SymmetricHeap::nvshmem). Host library only
// (nvshmemx_hostlib_init_attr): comet's kernels reach a peer's copy with plain loads and stores through
// nvshmem_ptr, as they do through a CUDA IPC mapping, so no kernel links NVSHMEM's device library.
// The host library is loaded at run time (dlopen of libnvshmem_host.so.3: $COMET_NVSHMEM_LIB, else the
// loader's search path, else the build's .deps/nvshmem/lib), so comet's binaries run where NVSHMEM is
// absent; available() says whether it loads. Built without NVSHMEM's headers, every call raises
// InvalidArgument saying so.
#pragma once

#include <cstddef>

#include "comet/team.hpp"

namespace comet::team_detail {

struct NvshmemHeap {
  static bool available();
  // Collective: NVSHMEM for PE `rank` of `world`, bootstrapped from rank 0's unique id, which travels
  // through the all-gather. One NVSHMEM team per process at a time.
  static void init(int rank, int world, const AllGatherFn& all_gather);
  static void* alloc(size_t bytes);           // collective (nvshmem_malloc)
  static void* peer(void* local, int pe);     // nvshmem_ptr; InvalidArgument if loads and stores cannot reach it
  static void free(void* local);              // collective (nvshmem_free)
  static void finalize();                     // collective
  // For kernels that call NVSHMEM's device API (MoeOptions::transport = nvshmem): the host library's
  // nvshmemx_culibrary_init (as void*, so that CUlibrary stays out of this header), and how many
  // initialisations this process has had: a module's device state is bound once per initialisation.
  static void* culibrary_init();
  static int session();
};

}  // namespace comet::team_detail
