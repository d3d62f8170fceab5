// Team base: per-rank streams and status words, symmetric-allocation tables, timeouts and the
// host side of failure reporting. The backends (LocalTeam, IpcTeam) fill in memory and barriers.
#include "comet/team.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "comet/cuda_check.hpp"
#include "team/cuda_helpers.hpp"

namespace comet {
namespace {

using team_detail::ScopedDevice;

// How the index of a wait site reads in a message.
std::string describe_wait(WaitSite site, int index) {
  switch (site) {
    case WaitSite::barrier: return detail::concat("barrier (peer ", index, ")");
    case WaitSite::tile_done: return detail::concat("tile_done ", index, " (m * n_blocks + n)");
    default: return detail::concat(to_string(site), " ", index);
  }
}

std::string describe_status(int rank, const DeviceStatus& s, double timeout_s) {
  if (s.code == 1) {
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.2f", timeout_s);
    return detail::concat("rank ", rank, ": timed out after ", seconds, " s waiting for ",
                          describe_wait(static_cast<WaitSite>(s.site), s.index), " >= ", s.expected, " (saw ",
                          s.seen, ")");
  }
  if (s.code == 2 && static_cast<WaitSite>(s.site) == WaitSite::peer_failed)
    return detail::concat("rank ", rank, ": the call failed on peer rank ", s.index,
                          " (its own error says why: rows over its capacity, bad routing or a timeout), so this "
                          "rank's outputs are NaN");
  return detail::concat("rank ", rank, ": device reported error code ", s.code, " at ",
                        describe_wait(static_cast<WaitSite>(s.site), s.index));
}

}  // namespace

Team::Team(int world, Link link, int device) : world_(world), link_(link), device_(device) {
  COMET_REQUIRE(world >= 1, "Team: world must be >= 1, got ", world);
  COMET_REQUIRE(link == Link::device || link == Link::host, "Team: unknown link value ", static_cast<int>(link));
  int count = 0;
  COMET_CUDA_CHECK(cudaGetDeviceCount(&count));
  COMET_REQUIRE(device >= 0 && device < count, "Team: device ", device, " out of range (this process sees ", count,
                " CUDA device(s))");
}

void Team::init_local_rank_state(int n_local) {
  ScopedDevice guard(device_);
  ranks_.resize(n_local);
  for (RankState& r : ranks_) {
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    COMET_CUDA_CHECK(cudaMalloc(&r.status_dev, sizeof(DeviceStatus)));
    team_detail::zero_device_sync(r.status_dev, sizeof(DeviceStatus));
  }
}

bool Team::is_local(int rank) const {
  const std::vector<int> local = local_ranks();
  return std::find(local.begin(), local.end(), rank) != local.end();
}

int Team::slot_of(int rank) const {
  COMET_REQUIRE(rank >= 0 && rank < world_, "rank ", rank, " out of range [0, ", world_, ")");
  const std::vector<int> local = local_ranks();
  const auto it = std::find(local.begin(), local.end(), rank);
  COMET_REQUIRE(it != local.end(), "rank ", rank, " is not driven by this process (", local.size(),
                " local rank(s), first ", local.empty() ? -1 : local.front(), ")");
  return static_cast<int>(it - local.begin());
}

cudaStream_t Team::stream(int rank) const { return ranks_.at(slot_of(rank)).stream; }

SymmetricId Team::register_allocation(Allocation a) {
  ScopedDevice guard(device_);
  a.peers_dev.assign(a.peers.size(), nullptr);
  // Push first so that release_base() frees the device tables even if an upload below fails.
  allocations_.push_back(std::move(a));
  Allocation& stored = allocations_.back();
  for (size_t slot = 0; slot < stored.peers.size(); ++slot) {
    const size_t table_bytes = stored.peers[slot].size() * sizeof(void*);
    COMET_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&stored.peers_dev[slot]), table_bytes));
    team_detail::upload_sync(stored.peers_dev[slot], stored.peers[slot].data(), table_bytes);
  }
  return SymmetricId{static_cast<int>(allocations_.size() - 1)};
}

namespace {
template <class Allocations>
auto& checked_allocation(Allocations& all, SymmetricId buf) {
  COMET_REQUIRE(buf.id >= 0 && static_cast<size_t>(buf.id) < all.size(), "unknown symmetric buffer id ", buf.id,
                " (", all.size(), " allocated)");
  COMET_REQUIRE(!all[buf.id].freed, "symmetric buffer ", buf.id, " was freed");
  return all[buf.id];
}
}  // namespace

Team::Allocation Team::retire_allocation(SymmetricId buf) {
  Allocation& a = checked_allocation(allocations_, buf);
  ScopedDevice guard(device_);
  for (void** table : a.peers_dev)
    if (table) cudaFree(table);
  Allocation gone = std::move(a);
  a = Allocation{};
  a.freed = true;  // ids stay positional: later ids keep their meaning
  return gone;
}

size_t Team::symmetric_bytes_in_use() const {
  size_t total = 0;
  for (const Allocation& a : allocations_)
    if (!a.freed) total += a.bytes;
  return total;
}

void* Team::local_ptr(SymmetricId buf, int rank) const {
  const Allocation& a = checked_allocation(allocations_, buf);
  return a.local.at(slot_of(rank));
}

void* const* Team::peer_ptrs(SymmetricId buf, int rank) const {
  const Allocation& a = checked_allocation(allocations_, buf);
  return a.peers_dev.at(slot_of(rank));
}

void* Team::peer_ptr(SymmetricId buf, int rank, int peer) const {
  const Allocation& a = checked_allocation(allocations_, buf);
  const int slot = slot_of(rank);
  COMET_REQUIRE(peer >= 0 && peer < world_, "peer ", peer, " out of range [0, ", world_, ")");
  return a.peers.at(slot).at(peer);
}

size_t Team::symmetric_bytes(SymmetricId buf) const { return checked_allocation(allocations_, buf).bytes; }

TeamDeviceView Team::device_view(int rank) const {
  TeamDeviceView v;
  v.rank = rank;
  v.world = world_;
  v.status = ranks_.at(slot_of(rank)).status_dev;
  v.timeout_ns = timeout_ns_;
  return v;
}

void Team::set_timeout(double seconds) {
  // The upper bound keeps the nanosecond count far from overflow; a day is longer than any wait.
  COMET_REQUIRE(std::isfinite(seconds) && seconds > 0.0 && seconds <= 86400.0,
                "set_timeout: seconds must be in (0, 86400], got ", seconds);
  timeout_ns_ = static_cast<uint64_t>(seconds * 1e9);
}

DeviceStatus Team::read_status(int rank) const {
  const int slot = slot_of(rank);
  ScopedDevice guard(device_);
  DeviceStatus s{};
  // A plain copy from the device is enough: the status is written by kernels that have ended (after a
  // synchronize) or is being written now, in which case the next check sees it.
  COMET_CUDA_CHECK(cudaMemcpy(&s, ranks_[slot].status_dev, sizeof(s), cudaMemcpyDeviceToHost));
  return s;
}

void Team::check(int rank) const {
  const DeviceStatus s = read_status(rank);
  if (s.code == 0) return;
  const std::string what = describe_status(rank, s, timeout());
  if (s.code == 1) throw TimeoutError(what);
  throw DeviceReportedError(what);
}

void Team::synchronize() {
  ScopedDevice guard(device_);
  for (const RankState& r : ranks_) COMET_CUDA_CHECK(cudaStreamSynchronize(r.stream));
  // Name every failing rank, not only the first: with virtual ranks one stall usually explains the rest.
  // A timeout stays a TimeoutError when the other local ranks only failed because of it (code 2: a
  // peer's call failed).
  std::string failures;
  bool timeouts = false, others = false;
  for (int rank : local_ranks()) {
    const DeviceStatus s = read_status(rank);
    if (s.code == 0) continue;
    failures += (failures.empty() ? "" : "; ") + describe_status(rank, s, timeout());
    timeouts = timeouts || s.code == 1;
    others = others || (s.code != 1 && s.code != 2);
  }
  if (failures.empty()) return;
  if (timeouts && !others) throw TimeoutError(failures);
  throw DeviceReportedError(failures);
}

void Team::clear_status(int rank) {
  const int slot = slot_of(rank);
  ScopedDevice guard(device_);
  // On the rank's stream, so the clear lands after every wait already enqueued for this rank.
  COMET_CUDA_CHECK(cudaMemsetAsync(ranks_[slot].status_dev, 0, sizeof(DeviceStatus), ranks_[slot].stream));
  COMET_CUDA_CHECK(cudaStreamSynchronize(ranks_[slot].stream));
}

void Team::release_base() noexcept {
  int previous = -1;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) cudaSetDevice(device_);
  for (RankState& r : ranks_) {
    if (r.stream) cudaStreamSynchronize(r.stream);
  }
  for (Allocation& a : allocations_) {
    for (void** table : a.peers_dev) {
      if (table) cudaFree(table);
    }
  }
  allocations_.clear();
  for (RankState& r : ranks_) {
    if (r.status_dev) cudaFree(r.status_dev);
    if (r.stream) cudaStreamDestroy(r.stream);
  }
  ranks_.clear();
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
}

}  // namespace comet
