#include "support/team_exchange.hpp"

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "comet/cuda_check.hpp"

namespace comet::testing {
namespace {

// The word rank `src` writes at element i of its slice in rank `dst`'s buffer in round `gen`; every
// input changes it, and it is never 0, so a missed write and a zero-initialised word both show.
__host__ __device__ uint32_t pattern_value(uint32_t gen, int src, int dst, uint64_t i) {
  if (gen == 0) return 0;
  uint64_t x = i + (uint64_t(gen & 0xffff) << 48) + (uint64_t(src & 0xff) << 40) + (uint64_t(dst & 0xff) << 32);
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  x ^= x >> 33;
  const uint32_t v = static_cast<uint32_t>(x);
  return v == 0 ? 1u : v;
}

struct MismatchRecord {
  unsigned long long count;
  unsigned long long index;  // of the first mismatch found, within its slice
  uint32_t got;
  uint32_t want;
  int src;
  int claimed;
};

__global__ void write_pattern_kernel(uint32_t* const* peers, int world, int src, size_t n, uint32_t gen) {
  const size_t total = static_cast<size_t>(world) * n;
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < total; k += size_t(gridDim.x) * blockDim.x) {
    const int dst = static_cast<int>(k / n);
    const size_t i = k % n;
    peers[dst][static_cast<size_t>(src) * n + i] = pattern_value(gen, src, dst, i);
  }
}

__global__ void check_pattern_kernel(const uint32_t* mine, int world, int dst, size_t n, uint32_t gen,
                                     MismatchRecord* record) {
  const size_t total = static_cast<size_t>(world) * n;
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < total; k += size_t(gridDim.x) * blockDim.x) {
    const int src = static_cast<int>(k / n);
    const size_t i = k % n;
    const uint32_t got = mine[k];
    const uint32_t want = pattern_value(gen, src, dst, i);
    if (got == want) continue;
    atomicAdd(&record->count, 1ull);
    if (atomicCAS(&record->claimed, 0, 1) == 0) {
      record->index = i;
      record->got = got;
      record->want = want;
      record->src = src;
    }
  }
}

unsigned grid_for(size_t elements) {
  const size_t blocks = (elements + 255) / 256;
  return static_cast<unsigned>(blocks < 1024 ? (blocks == 0 ? 1 : blocks) : 1024);
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

// One record per local rank, zeroed and ready before any rank's stream uses it.
std::unique_ptr<MismatchRecord, CudaFree> make_records(size_t n_local) {
  MismatchRecord* p = nullptr;
  COMET_CUDA_CHECK(cudaMalloc(&p, n_local * sizeof(MismatchRecord)));
  std::unique_ptr<MismatchRecord, CudaFree> owned(p);
  COMET_CUDA_CHECK(cudaMemset(p, 0, n_local * sizeof(MismatchRecord)));
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  return owned;
}

void enqueue_checks(Team& team, SymmetricId buf, size_t n, uint32_t gen, MismatchRecord* records, bool wait_signals,
                    int first_signal) {
  const std::vector<int> local = team.local_ranks();
  for (size_t slot = 0; slot < local.size(); ++slot) {
    const int d = local[slot];
    if (wait_signals) {
      for (int s = 0; s < team.world(); ++s) team.signal_wait(d, first_signal + s, gen);
    }
    const auto* mine = static_cast<const uint32_t*>(team.local_ptr(buf, d));
    check_pattern_kernel<<<grid_for(team.world() * n), 256, 0, team.stream(d)>>>(mine, team.world(), d, n, gen,
                                                                                 records + slot);
    COMET_CUDA_CHECK_LAUNCH();
  }
}

PatternCheck collect(Team& team, const MismatchRecord* records_dev) {
  const std::vector<int> local = team.local_ranks();
  std::vector<MismatchRecord> records(local.size());
  COMET_CUDA_CHECK(
      cudaMemcpy(records.data(), records_dev, records.size() * sizeof(MismatchRecord), cudaMemcpyDeviceToHost));
  PatternCheck out;
  for (size_t slot = 0; slot < local.size(); ++slot) {
    const MismatchRecord& r = records[slot];
    out.mismatches += r.count;
    if (r.count > 0 && out.first.empty()) {
      out.first = detail::concat("rank ", local[slot], ": ", r.count, " mismatches; first: element ", r.index,
                                 " of the slice from rank ", r.src, " is ", r.got, ", expected ", r.want);
    }
  }
  return out;
}

void check_arguments(const Team& team, SymmetricId buf, size_t n, int first_signal) {
  COMET_REQUIRE(n > 0, "pattern: n_per_slice must be > 0");
  COMET_REQUIRE(team.symmetric_bytes(buf) >= pattern_buffer_bytes(team.world(), n), "pattern: buffer of ",
                team.symmetric_bytes(buf), " bytes is smaller than ", pattern_buffer_bytes(team.world(), n));
  COMET_REQUIRE(first_signal >= 0 && first_signal + team.world() <= Team::kNumSignals,
                "pattern: signals [", first_signal, ", ", first_signal + team.world(), ") out of range");
}

}  // namespace

size_t pattern_buffer_bytes(int world, size_t n_per_slice) {
  return static_cast<size_t>(world) * n_per_slice * sizeof(uint32_t);
}

PatternCheck exchange_round(Team& team, SymmetricId buf, size_t n, uint32_t gen, int first_signal) {
  check_arguments(team, buf, n, first_signal);
  COMET_REQUIRE(gen >= 1, "exchange_round: gen must be >= 1 (0 means 'all zero')");
  COMET_CUDA_CHECK(cudaSetDevice(team.device()));
  const std::vector<int> local = team.local_ranks();
  auto records = make_records(local.size());

  for (int s : local) {
    auto* const* peers = reinterpret_cast<uint32_t* const*>(team.peer_ptrs(buf, s));
    write_pattern_kernel<<<grid_for(team.world() * n), 256, 0, team.stream(s)>>>(peers, team.world(), s, n, gen);
    COMET_CUDA_CHECK_LAUNCH();
    for (int d = 0; d < team.world(); ++d) team.signal_set(s, d, first_signal + s, gen);
  }
  team.barrier();
  enqueue_checks(team, buf, n, gen, records.get(), /*wait_signals=*/true, first_signal);
  team.barrier();
  team.synchronize();
  return collect(team, records.get());
}

PatternCheck check_pattern(Team& team, SymmetricId buf, size_t n, uint32_t gen) {
  check_arguments(team, buf, n, 0);
  COMET_CUDA_CHECK(cudaSetDevice(team.device()));
  auto records = make_records(team.local_ranks().size());
  enqueue_checks(team, buf, n, gen, records.get(), /*wait_signals=*/false, 0);
  team.synchronize();
  return collect(team, records.get());
}

}  // namespace comet::testing
