// IpcTeam: one process per rank (several may share one GPU). Each symmetric buffer is a cudaMalloc of
// this process, exported with a CUDA IPC handle; the handles travel through the caller's all-gather
// and every process opens its peers' copies.
#include <algorithm>
#include <cstring>

#include "comet/cuda_check.hpp"
#include "comet/team.hpp"
#include "team/cuda_helpers.hpp"
#include "team/ipc_barrier.hpp"
#include "team/nvshmem_heap.hpp"
#include "team/nvshmem_signals.hpp"

namespace comet {
namespace {

using team_detail::ScopedDevice;

// What one rank contributes to the all-gather of alloc_symmetric. The size and rank travel along so
// that a mismatched call sequence fails loudly instead of mapping the wrong buffer.
struct ExportRecord {
  cudaIpcMemHandle_t handle;
  uint64_t bytes;
  int32_t rank;
  int32_t world;
};

void release_ipc(std::vector<void*>& opened, std::vector<void*>& owned, uint64_t*& epoch) noexcept {
  for (void* p : opened) cudaIpcCloseMemHandle(p);
  opened.clear();
  for (void* p : owned) cudaFree(p);
  owned.clear();
  if (epoch) cudaFree(epoch);
  epoch = nullptr;
}

// Every rank's record of an allocation (its size, and its CUDA IPC handle where there is one), checked:
// every rank asked for the same bytes, in the same rank-major all-gather.
std::vector<ExportRecord> exchange_records(const AllGatherFn& all_gather, const cudaIpcMemHandle_t* handle,
                                           size_t bytes, int rank, int world) {
  ExportRecord me;
  std::memset(&me, 0, sizeof(me));
  if (handle) me.handle = *handle;
  me.bytes = bytes;
  me.rank = rank;
  me.world = world;
  std::vector<ExportRecord> all(world);
  all_gather(&me, all.data(), sizeof(ExportRecord));
  for (int p = 0; p < world; ++p) {
    COMET_REQUIRE(all[p].rank == p && all[p].world == world, "alloc_symmetric: all-gather slot ", p,
                  " came from rank ", all[p].rank, " of world ", all[p].world, " (expected rank ", p, " of ", world,
                  "): the all-gather must be rank-major over the same ranks");
    COMET_REQUIRE(all[p].bytes == bytes, "alloc_symmetric: rank ", p, " asked for ", all[p].bytes, " bytes, rank ",
                  rank, " for ", bytes, ": every rank must make the same calls with the same sizes");
  }
  return all;
}

// A meeting of every rank: each contributes one word and gets every rank's.
std::vector<int32_t> meet(const AllGatherFn& all_gather, int32_t mine, int world) {
  std::vector<int32_t> all(world);
  all_gather(&mine, all.data(), sizeof(mine));
  return all;
}

}  // namespace

const char* to_string(SymmetricHeap heap) { return heap == SymmetricHeap::nvshmem ? "nvshmem" : "cuda_ipc"; }

SymmetricHeap parse_heap(const std::string& s) {
  if (s == "cuda_ipc") return SymmetricHeap::cuda_ipc;
  if (s == "nvshmem") return SymmetricHeap::nvshmem;
  throw InvalidArgument(detail::concat("unknown symmetric heap '", s, "': expected 'cuda_ipc' or 'nvshmem'"));
}

bool nvshmem_available() { return team_detail::NvshmemHeap::available(); }

IpcTeam::IpcTeam(int rank, int world, AllGatherFn all_gather, int device, SymmetricHeap heap)
    : Team(world, Link::device, device), rank_(rank), all_gather_(std::move(all_gather)), heap_(heap) {
  // Checked before anything collective, so that every rank fails the same way without waiting.
  COMET_REQUIRE(rank >= 0 && rank < world, "IpcTeam: rank ", rank, " out of range [0, ", world, ")");
  COMET_REQUIRE(static_cast<bool>(all_gather_), "IpcTeam: all_gather must be a callable function");
  COMET_REQUIRE(heap == SymmetricHeap::cuda_ipc || heap == SymmetricHeap::nvshmem, "IpcTeam: unknown heap ",
                int(heap));
  COMET_REQUIRE(heap == SymmetricHeap::cuda_ipc || nvshmem_available(),
                "IpcTeam: SymmetricHeap::nvshmem, but NVSHMEM is not available in this process (built without its "
                "headers, or libnvshmem_host.so.3 does not load: set COMET_NVSHMEM_LIB)");
  try {
    ScopedDevice guard(device_);
    if (heap_ == SymmetricHeap::nvshmem) {
      team_detail::NvshmemHeap::init(rank_, world_, all_gather_);
      nvshmem_live_ = true;
    }
    init_local_rank_state(1);
    COMET_CUDA_CHECK(cudaMalloc(&barrier_epoch_, sizeof(uint64_t)));
    team_detail::zero_device_sync(barrier_epoch_, sizeof(uint64_t));
    signals_ = alloc_symmetric(team_detail::signal_area_bytes(kNumSignals, world));
    for (int p = 0; p < world_; ++p) maps_peers_ = maps_peers_ && peer_ptr(signals_, rank_, p) != nullptr;
    // Without pointers to every peer (NVSHMEM across nodes), the signals and the barrier are NVSHMEM's.
    if (!maps_peers_) team_detail::nvshmem_signals::bind();
  } catch (...) {
    release_ipc(opened_, owned_, barrier_epoch_);
    release_base();
    throw;
  }
}

void IpcTeam::close() {
  if (closed_) return;
  closed_ = true;
  std::string failure;
  {
    ScopedDevice guard(device_);
    for (RankState& r : ranks_)
      if (r.stream) cudaStreamSynchronize(r.stream);
    // Every rank has drained its own stream before it contributes: once the gather completes, no
    // kernel of any rank touches any of these buffers.
    try {
      meet(all_gather_, rank_, world_);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (nvshmem_live_) {
      // nvshmem_free and finalize are collective: only when every peer came (else they would wait for
      // a dead one forever); otherwise the heap goes with the process.
      if (failure.empty()) {
        for (void* p : nvshmem_owned_) team_detail::NvshmemHeap::free(p);
        team_detail::NvshmemHeap::finalize();
      }
      nvshmem_owned_.clear();
      nvshmem_live_ = false;
    }
    release_ipc(opened_, owned_, barrier_epoch_);
  }
  if (!failure.empty())
    throw TimeoutError(detail::concat("IpcTeam::close on rank ", rank_, ": not every peer arrived for the teardown (",
                                      failure, "); this rank's buffers are released"));
}

IpcTeam::~IpcTeam() {
  int previous = -1;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) cudaSetDevice(device_);
  for (RankState& r : ranks_) {
    if (r.stream) cudaStreamSynchronize(r.stream);
  }
  release_ipc(opened_, owned_, barrier_epoch_);
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
  release_base();
}

std::vector<int> IpcTeam::local_ranks() const { return {rank_}; }

SymmetricId IpcTeam::alloc_symmetric(size_t bytes) {
  COMET_REQUIRE(!closed_, "IpcTeam::alloc_symmetric: the team is closed");
  COMET_REQUIRE(bytes > 0, "alloc_symmetric: bytes must be > 0");
  ScopedDevice guard(device_);
  if (heap_ == SymmetricHeap::nvshmem) return alloc_nvshmem(bytes);
  void* mine = nullptr;
  COMET_CUDA_CHECK(cudaMalloc(&mine, bytes));
  owned_.push_back(mine);
  // Zeroed and complete before the handle leaves this process: peers may write as soon as they open it.
  team_detail::zero_device_sync(mine, bytes);

  cudaIpcMemHandle_t handle;
  COMET_CUDA_CHECK(cudaIpcGetMemHandle(&handle, mine));
  const std::vector<ExportRecord> all = exchange_records(all_gather_, &handle, bytes, rank_, world_);

  Allocation a;
  a.bytes = bytes;
  a.local = {mine};
  a.peers.assign(1, std::vector<void*>(world_, nullptr));
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) {
      a.peers[0][p] = mine;
      continue;
    }
    void* theirs = nullptr;
    COMET_CUDA_CHECK(cudaIpcOpenMemHandle(&theirs, all[p].handle, cudaIpcMemLazyEnablePeerAccess));
    opened_.push_back(theirs);
    a.peers[0][p] = theirs;
  }
  return register_allocation(std::move(a));
}

// NVSHMEM's heap: the sizes are checked before nvshmem_malloc (collective: a mismatch inside it would
// fail or wait), the copy is zeroed, and the ranks meet again before any peer may write into it.
SymmetricId IpcTeam::alloc_nvshmem(size_t bytes) {
  exchange_records(all_gather_, nullptr, bytes, rank_, world_);
  void* mine = team_detail::NvshmemHeap::alloc(bytes);
  nvshmem_owned_.push_back(mine);
  team_detail::zero_device_sync(mine, bytes);
  Allocation a;
  a.bytes = bytes;
  a.local = {mine};
  a.peers.assign(1, std::vector<void*>(world_, nullptr));
  for (int p = 0; p < world_; ++p) a.peers[0][p] = p == rank_ ? mine : team_detail::NvshmemHeap::peer(mine, p);
  meet(all_gather_, rank_, world_);  // every copy is zero
  return register_allocation(std::move(a));
}

void IpcTeam::free_symmetric(SymmetricId buf) {
  COMET_REQUIRE(!closed_, "IpcTeam::free_symmetric: the team is closed (close() freed every buffer)");
  symmetric_bytes(buf);  // an unknown or freed id is refused before the meeting
  ScopedDevice guard(device_);
  COMET_CUDA_CHECK(cudaStreamSynchronize(ranks_[0].stream));
  // First meeting: every rank has drained its stream, so no kernel anywhere touches the buffer, and
  // every rank frees the same one.
  std::string failure;
  try {
    const int32_t mine = buf.id;
    const std::vector<int32_t> all = meet(all_gather_, mine, world_);
    for (int p = 0; p < world_; ++p)
      COMET_REQUIRE(all[p] == mine, "IpcTeam::free_symmetric: rank ", p, " frees symmetric buffer ", all[p],
                    ", rank ", rank_, " buffer ", mine, ": every rank must free the same buffers in the same order");
  } catch (const InvalidArgument&) {
    throw;  // nothing freed: the ranks disagree, and a peer may still use the buffer
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const Allocation gone = retire_allocation(buf);
  if (heap_ == SymmetricHeap::nvshmem) {
    void* own = gone.local.at(0);
    nvshmem_owned_.erase(std::remove(nvshmem_owned_.begin(), nvshmem_owned_.end(), own), nvshmem_owned_.end());
    // nvshmem_free is collective (every peer is in it after the meeting); after a failed meeting it
    // would wait for the missing peer: the copy then goes with the process.
    if (failure.empty()) team_detail::NvshmemHeap::free(own);
    if (!failure.empty())
      throw TimeoutError(detail::concat("IpcTeam::free_symmetric on rank ", rank_, ": not every peer arrived (",
                                        failure, "); buffer ", buf.id, " is retired"));
    return;
  }
  for (int p = 0; p < world_; ++p) {
    void* mapped = gone.peers[0][p];
    if (p == rank_ || !mapped) continue;
    opened_.erase(std::remove(opened_.begin(), opened_.end(), mapped), opened_.end());
    cudaIpcCloseMemHandle(mapped);
  }
  // Second meeting: every peer has closed its mapping of this rank's copy before the copy is freed
  // (freeing memory another process still maps is undefined).
  if (failure.empty()) {
    try {
      meet(all_gather_, buf.id, world_);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  void* own = gone.local.at(0);
  owned_.erase(std::remove(owned_.begin(), owned_.end(), own), owned_.end());
  cudaFree(own);
  if (!failure.empty())
    throw TimeoutError(detail::concat("IpcTeam::free_symmetric on rank ", rank_, ": not every peer arrived (", failure,
                                      "); this rank's copy and mappings of buffer ", buf.id, " are released"));
}

void IpcTeam::require_agreement(const void* mine, size_t bytes, const std::string& what) {
  std::vector<char> all(bytes * world_);
  all_gather_(mine, all.data(), bytes);
  for (int p = 0; p < world_; ++p)
    COMET_REQUIRE(std::memcmp(all.data() + p * bytes, mine, bytes) == 0, what, ": rank ", p, " and rank ", rank_,
                  " disagree; every rank must build the same layer");
}

void IpcTeam::barrier() {
  COMET_REQUIRE(!closed_, "IpcTeam::barrier: the team is closed");
  ScopedDevice guard(device_);
  if (!maps_peers_) {
    uint64_t* own = static_cast<uint64_t*>(local_ptr(signals_, rank_)) + kNumSignals;
    return team_detail::nvshmem_signals::launch_barrier(ranks_[0].stream, barrier_epoch_, own, device_view(rank_));
  }
  auto* const* areas = reinterpret_cast<uint64_t* const*>(peer_ptrs(signals_, rank_));
  team_detail::launch_ipc_barrier(ranks_[0].stream, barrier_epoch_, areas, kNumSignals, device_view(rank_));
}

// Only on NVSHMEM's heap can a peer lack a pointer: its word is this rank's own symmetric address of it.
void IpcTeam::signal_set_unmapped(int rank, int owner, int id, uint64_t value) {
  COMET_REQUIRE(!closed_, "IpcTeam::signal_set: the team is closed");
  ScopedDevice guard(device_);
  uint64_t* own = static_cast<uint64_t*>(local_ptr(signals_, rank)) + id;
  team_detail::nvshmem_signals::launch_set(stream(rank), own, value, owner);
}

}  // namespace comet
