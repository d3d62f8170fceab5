// Team signal words: set / wait / reset, each a one-thread kernel on the acting rank's stream, so they
// order with that rank's other work exactly like any kernel. Release/acquire at system scope, because
// the word may live in another process's GPU memory or in mapped host memory (link = host).
#include "comet/cuda_check.hpp"
#include "comet/team.hpp"
#include "team/cuda_helpers.hpp"
#include "team/device_wait.cuh"

namespace comet {
namespace {

__global__ void signal_store_kernel(uint64_t* word, uint64_t value) { dev::st_release_sys(word, value); }

__global__ void signal_wait_kernel(const uint64_t* word, uint64_t value, TeamDeviceView team, int id) {
  dev::wait_signal_sys(word, value, team, WaitSite::signal, id);  // a timeout is recorded in team.status
}

void check_signal_id(int id) {
  COMET_REQUIRE(id >= 0 && id < Team::kNumSignals, "signal id ", id, " out of range [0, ", Team::kNumSignals, ")");
}

}  // namespace

uint64_t* Team::signal_ptr(int rank, int owner, int id) const {
  check_signal_id(id);
  auto* area = static_cast<uint64_t*>(peer_ptr(signals_, rank, owner));
  return area ? area + id : nullptr;  // null: no pointer reaches the owner's words (maps_peers())
}

void Team::signal_set(int rank, int owner, int id, uint64_t value) {
  uint64_t* word = signal_ptr(rank, owner, id);
  if (!word) return signal_set_unmapped(rank, owner, id, value);
  team_detail::ScopedDevice guard(device_);
  signal_store_kernel<<<1, 1, 0, stream(rank)>>>(word, value);
  COMET_CUDA_CHECK_LAUNCH();
}

void Team::signal_wait(int rank, int id, uint64_t value) {
  const uint64_t* word = signal_ptr(rank, rank, id);
  team_detail::ScopedDevice guard(device_);
  signal_wait_kernel<<<1, 1, 0, stream(rank)>>>(word, value, device_view(rank), id);
  COMET_CUDA_CHECK_LAUNCH();
}

void Team::signal_reset(int rank, int id) {
  uint64_t* word = signal_ptr(rank, rank, id);
  team_detail::ScopedDevice guard(device_);
  signal_store_kernel<<<1, 1, 0, stream(rank)>>>(word, 0);
  COMET_CUDA_CHECK_LAUNCH();
}

void Team::signal_set_unmapped(int rank, int owner, int id, uint64_t value) {
  (void)value;
  throw InvalidArgument(detail::concat("Team::signal_set: rank ", rank, " has no pointer to rank ", owner,
                                       "'s signal word ", id));
}

}  // namespace comet
