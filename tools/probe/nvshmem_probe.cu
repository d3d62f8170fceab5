// comet-nvshmem-probe (issue 19): can NVSHMEM run several PEs on one GPU, and which of its paths work
// there? Run plainly it is the parent: it starts W copies of itself (one PE each, all on device 0),
// waits for them (bounded) and prints one line per PE and a verdict. Each PE:
//   1. bootstraps from a unique id (PE 0 writes it to a file the others read: no MPI, as a Team's
//      all-gather would carry it), nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID)
//   2. nvshmem_malloc's a symmetric buffer and asks nvshmem_ptr for every peer's copy (a non-null
//      pointer means plain loads and stores reach it: our IPC kernels could run on it unchanged)
//   3. device put: one nvshmem_int_p per peer, nvshmem_barrier_all, each PE checks what it received
//   4. bulk put: nvshmemx_putmem_nbi_block of `bytes` into the next PE, timed (GB/s), checked
//   5. load/store through the nvshmem_ptr pointer, timed and checked
//   6. nvshmemx_barrier_all_on_stream, nvshmem_free, nvshmem_finalize
// COMET_NVSHMEM_HOSTLIB=1: the host library alone (nvshmemx_hostlib_init_attr; no device library, no
// relocatable device code): steps 1, 2 and 5 with host barriers, what a Team built on NVSHMEM's heap
// and our own kernels needs.
// Any NVSHMEM error ends that PE; the parent reports its exit status and the last step it reached.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness/pe_processes.hpp"

namespace {

#define PROBE_CUDA(call) COMET_PE_CUDA(g_pe, call)

int g_pe = -1;

__global__ void put_ints(int* buf, int me, int npes) {
  for (int peer = threadIdx.x; peer < npes; peer += blockDim.x)
    if (peer != me) nvshmem_int_p(buf + me, 1000 + me, peer);  // slot `me` of each peer's copy
}

__global__ void put_bulk(char* dst, const char* src, size_t bytes, int peer) {
  // Each block ships its share with the block-wide non-blocking put; quiet makes it complete.
  const size_t share = (bytes + gridDim.x - 1) / gridDim.x;
  const size_t begin = share * blockIdx.x, end = begin + share < bytes ? begin + share : bytes;
  if (begin < end) nvshmemx_putmem_nbi_block(dst + begin, src + begin, end - begin, peer);
  nvshmem_quiet();
}

__global__ void fill(char* buf, size_t bytes, char value) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
    buf[i] = value;
}

__global__ void store_through(const uint4* src, uint4* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

__global__ void count_value(const char* buf, size_t bytes, char value, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
    mine += buf[i] != value;
  if (mine) atomicAdd(bad, mine);
}

unsigned long long mismatches(const char* buf, size_t bytes, char value) {
  unsigned long long* bad = nullptr;
  PROBE_CUDA(cudaMallocManaged(&bad, sizeof(*bad)));
  *bad = 0;
  count_value<<<264, 256>>>(buf, bytes, value, bad);
  PROBE_CUDA(cudaDeviceSynchronize());
  const unsigned long long n = *bad;
  cudaFree(bad);
  return n;
}

void step(const char* what) {
  std::printf("pe %d: %s\n", g_pe, what);
  std::fflush(stdout);
}

int run_pe(int pe, int npes, const std::string& id_path, size_t bytes) {
  g_pe = pe;
  PROBE_CUDA(cudaSetDevice(0));
  nvshmemx_uniqueid_t id;
  std::memset(&id, 0, sizeof(id));
  if (!comet::harness::share_bytes(pe, id_path, &id, sizeof(id), [&] { return nvshmemx_get_uniqueid(&id) == 0; })) {
    step(pe == 0 ? "nvshmemx_get_uniqueid failed" : "no unique id from PE 0 within 30 s");
    return pe == 0 ? 4 : 5;
  }
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  nvshmemx_set_attr_uniqueid_args(pe, npes, &id, &attr);
  const bool hostlib = std::getenv("COMET_NVSHMEM_HOSTLIB") != nullptr;
  step(hostlib ? "hostlib init ..." : "init ...");
  if (hostlib) {
    if (nvshmemx_hostlib_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0) {
      step("nvshmemx_hostlib_init_attr failed");
      return 8;
    }
  } else {
    nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
  }
  std::printf("pe %d: init ok: my_pe %d of %d, node pes %d\n", pe, nvshmem_my_pe(), nvshmem_n_pes(),
              nvshmem_team_n_pes(NVSHMEMX_TEAM_NODE));

  char* buf = static_cast<char*>(nvshmem_malloc(bytes));
  int* ints = static_cast<int*>(nvshmem_malloc(sizeof(int) * npes));
  if (!buf || !ints) {
    step("nvshmem_malloc returned null");
    return 6;
  }
  PROBE_CUDA(cudaMemset(ints, 0, sizeof(int) * npes));
  std::string ptrs;
  bool all_mapped = true;
  for (int q = 0; q < npes; ++q) {
    void* p = nvshmem_ptr(buf, q);
    all_mapped = all_mapped && p != nullptr;
    ptrs += (ptrs.empty() ? "" : " ") + std::to_string(q) + (p ? ":mapped" : ":null");
  }
  std::printf("pe %d: nvshmem_malloc ok; nvshmem_ptr %s\n", pe, ptrs.c_str());
  nvshmem_barrier_all();

  const int next = (pe + 1) % npes, prev = (pe + npes - 1) % npes;
  cudaEvent_t e0, e1;
  PROBE_CUDA(cudaEventCreate(&e0));
  PROBE_CUDA(cudaEventCreate(&e1));
  float ms = 0;
  int wrong = 0;
  unsigned long long bad_bulk = 0, bad_store = 0;
  if (!hostlib) {
  // 3. device put of one int to every peer.
  put_ints<<<1, 32>>>(ints, pe, npes);
  PROBE_CUDA(cudaDeviceSynchronize());
  nvshmem_barrier_all();
  std::vector<int> got(npes);
  PROBE_CUDA(cudaMemcpy(got.data(), ints, sizeof(int) * npes, cudaMemcpyDeviceToHost));
  for (int q = 0; q < npes; ++q) wrong += q != pe && got[q] != 1000 + q;
  std::printf("pe %d: device nvshmem_int_p to %d peers: %s\n", pe, npes - 1, wrong ? "WRONG" : "ok");

  // 4. bulk put from a second symmetric buffer into the next PE's first.
  char* src = static_cast<char*>(nvshmem_malloc(bytes));
  fill<<<264, 256>>>(src, bytes, char(pe + 1));
  PROBE_CUDA(cudaDeviceSynchronize());
  nvshmem_barrier_all();
  PROBE_CUDA(cudaEventRecord(e0));
  put_bulk<<<32, 512>>>(buf, src, bytes, next);
  PROBE_CUDA(cudaEventRecord(e1));
  PROBE_CUDA(cudaEventSynchronize(e1));
  PROBE_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  nvshmem_barrier_all();
  bad_bulk = mismatches(buf, bytes, char(prev + 1));
  std::printf("pe %d: bulk putmem_nbi_block %.1f MB to pe %d: %.3f ms, %.1f GB/s, %s\n", pe, bytes / 1e6, next, ms,
              bytes / (ms * 1e-3) / 1e9, bad_bulk ? "WRONG" : "ok");
  nvshmem_free(src);
  }

  // 5. loads and stores through nvshmem_ptr (what our IPC kernels do with a peer pointer).
  if (all_mapped) {
    char* scratch = nullptr;
    PROBE_CUDA(cudaMalloc(&scratch, bytes));
    fill<<<264, 256>>>(scratch, bytes, char(100 + pe));
    PROBE_CUDA(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    char* peer = static_cast<char*>(nvshmem_ptr(buf, next));
    PROBE_CUDA(cudaEventRecord(e0));
    store_through<<<132, 512>>>(reinterpret_cast<const uint4*>(scratch), reinterpret_cast<uint4*>(peer), bytes / 16);
    PROBE_CUDA(cudaEventRecord(e1));
    PROBE_CUDA(cudaEventSynchronize(e1));
    PROBE_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    nvshmem_barrier_all();
    bad_store = mismatches(buf, bytes, char(100 + prev));
    std::printf("pe %d: stores through nvshmem_ptr to pe %d: %.3f ms, %.1f GB/s, %s\n", pe, next, ms,
                bytes / (ms * 1e-3) / 1e9, bad_store ? "WRONG" : "ok");
    cudaFree(scratch);
  }

  // 6. stream barrier, free, finalize.
  if (!hostlib) {
    cudaStream_t s;
    PROBE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    nvshmemx_barrier_all_on_stream(s);
    PROBE_CUDA(cudaStreamSynchronize(s));
  }
  nvshmem_free(ints);
  nvshmem_free(buf);
  step("nvshmem_free ok; finalize ...");
  if (hostlib) {
    nvshmemx_hostlib_finalize();
  } else {
    nvshmem_finalize();
  }
  step("done");
  return wrong || bad_bulk || bad_store || !all_mapped ? 7 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int npes = argc > 1 ? std::atoi(argv[1]) : 2;
  const size_t bytes = size_t(argc > 2 ? std::atof(argv[2]) : 64) * 1000 * 1000;
  if (const int pe = comet::harness::pe_from_env(); pe >= 0) return run_pe(pe, npes, comet::harness::id_path_from_env(), bytes);
  if (npes < 1 || npes > 16) {
    std::fprintf(stderr, "usage: comet-nvshmem-probe [PEs 1-16] [MB per put]\n");
    return 2;
  }
  const int failed = comet::harness::spawn_pes(npes, argv, 90);
  std::printf("%s: %d PEs on one GPU, %d failed\n", failed ? "FAIL" : "PASS", npes, failed);
  return failed ? 1 : 0;
}
