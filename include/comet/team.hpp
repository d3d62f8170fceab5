// Team: W ranks with symmetric buffers (every rank can address every peer's copy), signal words and a
// barrier. Backends: LocalTeam (W virtual ranks in one process on one GPU) and IpcTeam (one process
// per rank, CUDA IPC). Device-side waits are bounded; a timeout lands in the rank's DeviceStatus and
// the host raises TimeoutError naming rank, site, index and the value seen.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comet/common.hpp"

namespace comet {

// Where a rank's exported (symmetric) buffers live.
//  device: in the rank's GPU memory (peers reach it over NVLink / peer access, or the same HBM).
//  host:   in mapped pinned host memory, so that every remote access crosses the PCIe link. This is our
//          stand-in for an interconnect on one GPU.
enum class Link : int { device = 0, host = 1 };
const char* to_string(Link link);
Link parse_link(const std::string& s);  // "device" | "host"; throws InvalidArgument

// What a bounded device wait was waiting for (reported on timeout).
enum class WaitSite : int32_t {
  none = 0,
  signal = 1,       // index: signal id
  barrier = 2,      // index: peer rank
  tile_ready = 3,   // layer 0, index: M-tile
  tile_done = 4,    // layer 1, index: tile (m * n_blocks + n)
  test = 5,
  bulk_copy = 6,    // a comm block's bulk copy did not complete, index: unit (>= 0) or a ring wait (< 0)
  peer_failed = 7,  // not a wait: a peer's call failed (code 2), index: the peer (kernels/peer_failure.hpp)
};
const char* to_string(WaitSite site);

// One per rank, in device memory (device atomics on it are plain GPU atomics); Team::check copies it
// to the host. Kernels never trap on a timeout: they record it here and end, so the context stays
// usable and the host can raise a precise error. The first failure wins (code is set with atomicCAS).
struct DeviceStatus {
  int32_t code;   // 0: ok, 1: timeout, 2: a peer's call failed (this rank's outputs are NaN)
  int32_t rank;
  int32_t site;   // WaitSite
  int32_t index;
  int64_t expected;
  int64_t seen;
  int32_t abort;  // set with the error: other waiters of this rank give up at once
  int32_t pad;
};

// What kernels need to report and bound their waits; passed by value.
struct TeamDeviceView {
  int rank = 0;
  int world = 1;
  DeviceStatus* status = nullptr;  // device pointer to this rank's status
  uint64_t timeout_ns = 0;
};

// Handle of a symmetric allocation (same id on every rank).
struct SymmetricId {
  int id = -1;
};

class Team {
 public:
  virtual ~Team() = default;

  int world() const { return world_; }
  Link link() const { return link_; }
  int device() const { return device_; }

  // Ranks driven by this process (LocalTeam: all W; IpcTeam: one).
  virtual std::vector<int> local_ranks() const = 0;
  bool is_local(int rank) const;

  // Each local rank's work goes on its own stream.
  cudaStream_t stream(int rank) const;

  // Collective: every process calls it in the same order with the same size. Zero-initialised.
  virtual SymmetricId alloc_symmetric(size_t bytes) = 0;
  // Collective: every process frees the same buffer, in the same order relative to the other
  // collective calls. Waits for the local ranks' streams first (their kernels may still use it); after
  // it, the id is refused. IpcTeam meets every peer twice (see IpcTeam::free_symmetric).
  virtual void free_symmetric(SymmetricId buf) = 0;
  // Bytes of the symmetric buffers this process holds for one rank, freed ones excluded.
  size_t symmetric_bytes_in_use() const;
  // Whether other processes drive some of the ranks (collective calls then need every process).
  bool spans_processes() const { return local_ranks().size() < size_t(world_); }
  // `rank`'s own copy, as `rank` addresses it (rank must be local).
  void* local_ptr(SymmetricId buf, int rank) const;
  // Device array [W]: entry p is peer p's copy as `rank` addresses it (entry rank == local_ptr); null
  // for a peer whose memory no pointer reaches (maps_peers() false).
  void* const* peer_ptrs(SymmetricId buf, int rank) const;
  // Host-side copy of the same table.
  void* peer_ptr(SymmetricId buf, int rank, int peer) const;
  size_t symmetric_bytes(SymmetricId buf) const;
  // Whether every rank reaches every peer's buffers with loads and stores (peer_ptrs has no null).
  // False for an IpcTeam on NVSHMEM's heap across nodes: its signals and barrier then go through
  // NVSHMEM, and a FusedMoe on it needs MoeOptions::transport = nvshmem.
  bool maps_peers() const { return maps_peers_; }

  // Signal words: every rank owns kNumSignals uint64 words in exported memory; peers set them.
  static constexpr int kNumSignals = 64;
  uint64_t* signal_ptr(int rank, int owner, int id) const;  // owner's word `id` as `rank` addresses it; null: unmapped
  // Enqueue on `rank`'s stream: set owner's word `id` to value (release, system scope).
  void signal_set(int rank, int owner, int id, uint64_t value);
  // Enqueue on `rank`'s stream: wait (bounded) until rank's own word `id` >= value.
  void signal_wait(int rank, int id, uint64_t value);
  // Enqueue on `rank`'s stream: reset rank's own word `id` to 0.
  void signal_reset(int rank, int id);

  // Enqueue on every local rank's stream: no rank's stream passes until all W ranks reached it.
  virtual void barrier() = 0;

  // Collective: every process passes its own description of something all ranks must agree on (a
  // layer's shape and layout, say); raises InvalidArgument naming `what` and the first rank whose
  // bytes differ. One process (LocalTeam) agrees with itself.
  virtual void require_agreement(const void* mine, size_t bytes, const std::string& what) {
    (void)mine, (void)bytes, (void)what;
  }

  // Whether the team's buffers are gone (IpcTeam::close): nothing may run on it any more.
  bool closed() const { return closed_; }

  TeamDeviceView device_view(int rank) const;
  void set_timeout(double seconds);
  double timeout() const { return timeout_ns_ * 1e-9; }

  // Synchronises every local stream, then raises TimeoutError if any local rank's status is set.
  void synchronize();
  // Raises TimeoutError if rank's status holds a timeout, DeviceReportedError for another failure
  // (does not synchronise).
  void check(int rank) const;
  DeviceStatus read_status(int rank) const;  // the rank's status as the device left it
  // Clears rank's status (after a reported error, for tests).
  void clear_status(int rank);

 protected:
  struct RankState {
    cudaStream_t stream = nullptr;
    DeviceStatus* status_dev = nullptr;  // device memory
  };
  struct Allocation {
    size_t bytes = 0;
    bool freed = false;
    std::vector<void*> local;            // [local rank slot] own copy
    std::vector<std::vector<void*>> peers;  // [local rank slot][W]
    std::vector<void**> peers_dev;          // [local rank slot] device copy of peers
  };

  Team(int world, Link link, int device);
  void init_local_rank_state(int n_local);
  int slot_of(int rank) const;  // index of a local rank in local_ranks()
  SymmetricId register_allocation(Allocation a);
  // The allocation's tables released and the id marked freed (the backend frees the memory itself).
  Allocation retire_allocation(SymmetricId buf);
  void release_base() noexcept;
  // signal_set to an owner no pointer reaches (maps_peers() false); the base class has no other way.
  virtual void signal_set_unmapped(int rank, int owner, int id, uint64_t value);

  int world_;
  Link link_;
  int device_;
  uint64_t timeout_ns_ = 10ull * 1000 * 1000 * 1000;  // 10 s
  std::vector<RankState> ranks_;         // by local slot
  std::vector<Allocation> allocations_;
  SymmetricId signals_{};               // kNumSignals words per rank (plus the barrier's words)
  bool closed_ = false;
  bool maps_peers_ = true;
};

// W virtual ranks in one process on one GPU.
class LocalTeam final : public Team {
 public:
  LocalTeam(int world, Link link = Link::device, int device = 0);
  ~LocalTeam() override;
  std::vector<int> local_ranks() const override;
  SymmetricId alloc_symmetric(size_t bytes) override;
  void free_symmetric(SymmetricId buf) override;  // one process: no peer to meet
  // Event join across the W streams.
  void barrier() override;

 private:
  std::vector<void*> owned_;  // device or pinned host blocks to free
  std::vector<cudaEvent_t> events_;
};

// Exchanges `bytes` from every rank: `all` receives world * bytes, rank-major. Collective.
using AllGatherFn = std::function<void(const void* mine, void* all, size_t bytes)>;

// Where an IpcTeam's symmetric buffers come from. The kernels are the same either way: they reach a
// peer's copy with plain loads and stores through a peer pointer.
//  cuda_ipc  each process cudaMalloc's its copy and shares it with a CUDA IPC memory handle.
//  nvshmem   NVSHMEM's symmetric heap (nvshmem_malloc; a peer's copy through nvshmem_ptr), NVSHMEM
//            bootstrapped from a unique id that travels through the all-gather; its host library is
//            loaded at run time (nvshmem_available()). One NVSHMEM team per process at a time.
//            Where a peer's copy has no pointer (another node; COMET_NVSHMEM_PEER_POINTERS=0 on one),
//            maps_peers() is false and the signals and the barrier are NVSHMEM signal operations.
//            Teardown as cuda_ipc's; without close(), its buffers live until the process ends.
enum class SymmetricHeap : int { cuda_ipc = 0, nvshmem = 1 };
const char* to_string(SymmetricHeap heap);
SymmetricHeap parse_heap(const std::string& s);  // "cuda_ipc" | "nvshmem"; throws InvalidArgument
bool nvshmem_available();  // built with NVSHMEM's headers and its host library loads

// One process per rank on one node. Buffers are cudaMalloc'ed (link = device) and shared with CUDA IPC
// memory handles (or come from NVSHMEM: SymmetricHeap), exchanged through the caller's all-gather
// (torch.distributed from Python; a Unix-socket rendezvous in C++ tests). Several ranks may share one
// GPU (processes on one H200).
class IpcTeam final : public Team {
 public:
  IpcTeam(int rank, int world, AllGatherFn all_gather, int device = 0, SymmetricHeap heap = SymmetricHeap::cuda_ipc);
  ~IpcTeam() override;
  std::vector<int> local_ranks() const override;
  SymmetricId alloc_symmetric(size_t bytes) override;
  // Collective: drains this rank's stream, meets every peer (all-gather of the id: a peer freeing
  // another buffer is an InvalidArgument, and nothing is freed), closes this process's mappings of the
  // peers' copies, meets every peer again (so that no mapping of this rank's copy is left open
  // anywhere), then frees its own copy. A peer that never arrives makes the all-gather fail (bounded by
  // its own timeout): the mappings and the copy are released all the same, and the error is raised.
  void free_symmetric(SymmetricId buf) override;
  // Device barrier over the signal words (graph-safe: its epoch lives in device memory).
  void barrier() override;
  void require_agreement(const void* mine, size_t bytes, const std::string& what) override;
  int rank() const { return rank_; }
  SymmetricHeap heap() const { return heap_; }

  // Collective teardown: waits for this rank's own work (every device wait is bounded), meets every
  // peer through the all-gather, so that no rank frees a buffer a peer may still read or write, then
  // closes the peers' handles and frees this rank's buffers. A peer that never arrives (dead or stuck)
  // makes the all-gather fail (bounded by its own timeout: the socket rendezvous' deadline, the
  // process group's timeout): the buffers are released all the same (a dead peer reads nothing) and
  // the all-gather's error is raised. After close() the team refuses all work; a second call does
  // nothing. Without close(), the destructor releases without meeting the peers: a rank that ends
  // first may then free memory a slower peer is still writing into.
  void close();

 private:
  SymmetricId alloc_nvshmem(size_t bytes);
  void signal_set_unmapped(int rank, int owner, int id, uint64_t value) override;

  int rank_;
  AllGatherFn all_gather_;
  SymmetricHeap heap_;
  bool nvshmem_live_ = false;         // NVSHMEM initialised and not finalised
  std::vector<void*> nvshmem_owned_;  // own copies on NVSHMEM's heap (allocation order: the same on every rank)
  std::vector<void*> owned_;   // own cudaMalloc blocks
  std::vector<void*> opened_;  // peers' blocks opened with cudaIpcOpenMemHandle
  uint64_t* barrier_epoch_ = nullptr;  // device word
};

}  // namespace comet
