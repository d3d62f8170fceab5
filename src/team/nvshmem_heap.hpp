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
  // nvshmem_ptr: PE `pe`'s copy as loads and stores reach it, or null where none do (another node).
  // COMET_NVSHMEM_PEER_POINTERS=0 makes it null for every other PE, as across nodes, so that one GPU
  // tests what several nodes run (the team's signals and a layer's transport through NVSHMEM only).
  static void* peer(void* local, int pe);
  static void free(void* local);              // collective (nvshmem_free)
  static void finalize();                     // collective
  // For kernels that call NVSHMEM's device API (MoeOptions::transport = nvshmem): the host library's
  // nvshmemx_culibrary_init (as void*, so that CUlibrary stays out of this header), and how many
  // initialisations this process has had: a module's device state is bound once per initialisation.
  static void* culibrary_init();
  static int session();
  // Fills the NVSHMEM device state of the module (CUDA library) that holds `kernel`: every module whose
  // kernels call NVSHMEM's inlined device API (team/nvshmem_device.cuh) needs it once per
  // initialisation. Throws CudaError / InvalidArgument naming the failing step.
  static void bind_module(const void* kernel);
  // Whether NVSHMEM may move data through a NIC (NVSHMEM_REMOTE_TRANSPORT is set and not "none"; comet
  // sets "none" unless the environment chose one). Local buffers of gets and puts must then be
  // registered (register_buffer), as the NIC reads or writes them.
  static bool remote_transport();
  static void register_buffer(void* p, size_t bytes);  // nvshmemx_buffer_register
  static void unregister_buffer(void* p) noexcept;     // nvshmemx_buffer_unregister
};

}  // namespace comet::team_detail
