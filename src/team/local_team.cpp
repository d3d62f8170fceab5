// LocalTeam: W virtual ranks in one process on one GPU. Every rank's copy of a symmetric buffer is
// an ordinary allocation of this process, so a peer pointer is just that allocation's device address.
// link = host puts every copy in mapped pinned host memory: each remote access then crosses PCIe.
#include <algorithm>
#include <cstring>

#include "comet/cuda_check.hpp"
#include "comet/team.hpp"
#include "team/cuda_helpers.hpp"

namespace comet {
namespace {

using team_detail::ScopedDevice;

// Frees what LocalTeam owns; safe on partially built state (constructor failure) and never throws.
void release_local(Link link, std::vector<void*>& owned, std::vector<cudaEvent_t>& events) noexcept {
  for (void* p : owned) {
    if (link == Link::host) {
      cudaFreeHost(p);
    } else {
      cudaFree(p);
    }
  }
  owned.clear();
  for (cudaEvent_t e : events) {
    if (e) cudaEventDestroy(e);
  }
  events.clear();
}

// The pinned host block behind a mapped device address (link = host): what cudaFreeHost takes.
void* host_of(void* device_address) {
  cudaPointerAttributes attr{};
  COMET_CUDA_CHECK(cudaPointerGetAttributes(&attr, device_address));
  return attr.hostPointer ? attr.hostPointer : device_address;
}

}  // namespace

LocalTeam::LocalTeam(int world, Link link, int device) : Team(world, link, device) {
  try {
    ScopedDevice guard(device_);
    init_local_rank_state(world);
    events_.assign(world, nullptr);
    for (cudaEvent_t& e : events_) COMET_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    signals_ = alloc_symmetric(team_detail::signal_area_bytes(kNumSignals, world));
  } catch (...) {
    release_local(link_, owned_, events_);
    release_base();
    throw;
  }
}

LocalTeam::~LocalTeam() {
  int previous = -1;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) cudaSetDevice(device_);
  // Kernels of any rank may still touch any rank's buffers: drain every stream before freeing.
  for (RankState& r : ranks_) {
    if (r.stream) cudaStreamSynchronize(r.stream);
  }
  release_local(link_, owned_, events_);
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
  release_base();
}

std::vector<int> LocalTeam::local_ranks() const {
  std::vector<int> ranks(world_);
  for (int r = 0; r < world_; ++r) ranks[r] = r;
  return ranks;
}

SymmetricId LocalTeam::alloc_symmetric(size_t bytes) {
  COMET_REQUIRE(bytes > 0, "alloc_symmetric: bytes must be > 0");
  ScopedDevice guard(device_);
  Allocation a;
  a.bytes = bytes;
  std::vector<void*> copies(world_, nullptr);  // device addresses, one per rank
  for (int r = 0; r < world_; ++r) {
    if (link_ == Link::host) {
      void* host = nullptr;
      COMET_CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
      owned_.push_back(host);
      std::memset(host, 0, bytes);
      COMET_CUDA_CHECK(cudaHostGetDevicePointer(&copies[r], host, 0));
    } else {
      COMET_CUDA_CHECK(cudaMalloc(&copies[r], bytes));
      owned_.push_back(copies[r]);
      team_detail::zero_device_sync(copies[r], bytes);
    }
  }
  // One process addresses every copy the same way, so every rank's peer table is the same.
  a.local = copies;
  a.peers.assign(world_, copies);
  return register_allocation(std::move(a));
}

void LocalTeam::free_symmetric(SymmetricId buf) {
  ScopedDevice guard(device_);
  // Any rank's kernels may touch any rank's copy: drain every stream first.
  for (RankState& r : ranks_) COMET_CUDA_CHECK(cudaStreamSynchronize(r.stream));
  const Allocation gone = retire_allocation(buf);
  for (void* p : gone.local) {
    void* block = link_ == Link::host ? host_of(p) : p;
    owned_.erase(std::remove(owned_.begin(), owned_.end(), block), owned_.end());
    COMET_CUDA_CHECK(link_ == Link::host ? cudaFreeHost(block) : cudaFree(block));
  }
}

void LocalTeam::barrier() {
  ScopedDevice guard(device_);
  // An event join: each stream records where it is, then waits for every other stream's record.
  // No kernel waits on another rank's kernel, so ranks whose kernels run one after another on the
  // same GPU cannot deadlock (DESIGN.md section 6). Works under stream capture too.
  for (int r = 0; r < world_; ++r) COMET_CUDA_CHECK(cudaEventRecord(events_[r], ranks_[r].stream));
  for (int r = 0; r < world_; ++r) {
    for (int q = 0; q < world_; ++q) {
      if (q != r) COMET_CUDA_CHECK(cudaStreamWaitEvent(ranks_[r].stream, events_[q], 0));
    }
  }
}

}  // namespace comet
