// The comm roles over NVSHMEM's device transport (issue 19): layer 0's pull (run_dispatch_role) and
// layer 1's combine (run_combine_role) with NvshmemTransport (gets and puts to PEs) against the same
// roles with PeerTransport (loads and stores through nvshmem_ptr, what the fused kernels do), several
// PEs on one GPU, every PE a process.
//
// Each PE builds every rank's routing from the case's seed (so it can check any rank's data), its own
// plan on the host, and then, for each transport:
//   dispatch: comm blocks pull every remote unit's row into the gathered buffer A (local units are the
//             scatter kernel's, not the role's: their rows must stay untouched);
//   combine:  comm blocks weight, sum and ship every unit's slice to its owner's receive buffer
//             (comm-only: Y is filled before, so no tile flags are waited on).
// Checks: A against the owners' token rows, bit for bit; each receive slot and the self partial
// against the CPU sum in the role's order (fp32, slot order; within one bf16 rounding of the device's);
// and the NVSHMEM run bitwise equal to the peer-pointer run, whose comm-block counts differ (so the bits
// do not depend on n_comm either). Each role is also timed per transport and the rates printed (one
// GPU shared by all PEs: the rates compare the transports, they are not a link's).
//
//   comet_nvshmem_transport_tests [PEs = 2]        runs every case with PEs processes; exit 0 = all pass,
//                                                 77 = no GPU (skipped), else the failures are printed.
// NVSHMEM's host library is found through the loader (the build's rpath to .deps/nvshmem/lib, or
// LD_LIBRARY_PATH); its bootstrap plugin next to it, unless NVSHMEM_BOOTSTRAP_PLUGIN says otherwise.
// No NVSHMEM device library: the device API is inlined (team/nvshmem_device.cuh) and each module's
// device state bound (NvshmemHeap::bind_module: nvshmemx_culibrary_init) after the host library's
// initialisation.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "comet/bf16.hpp"
#include "comet/plan.hpp"
#include "harness/pe_processes.hpp"
#include "kernels/combine_role.cuh"
#include "kernels/dispatch_role.cuh"
#include "kernels/fused_layers.hpp"
#include "kernels/nvshmem/fused_nvshmem.hpp"
#include "kernels/transport_nvshmem.cuh"  // NVSHMEM's headers, with its device API inlined
#include "team/nvshmem_heap.hpp"

namespace comet {
namespace {

#define PE_CUDA(call) COMET_PE_CUDA(g_pe, call)

int g_pe = -1;

// ---- the cases -----------------------------------------------------------------------------------
enum class Routing { uniform, one_group, empty_rank };
struct Case {
  const char* name;
  int hidden, experts, topk, tokens, tp;
  Routing routing;
  bool fused = false;  // also the fused layers (every tile width the NVSHMEM transport has)
};

// Every rank's top-k from the case's seed: distinct experts, gates in (0, 1).
struct RankRouting {
  int tokens = 0;
  std::vector<int32_t> ids;
  std::vector<float> gates;
};
RankRouting routing_of(const Case& c, int rank, int world) {
  RankRouting r;
  r.tokens = c.routing == Routing::empty_rank && rank == 1 % world ? 0 : c.tokens - 7 * rank;
  std::mt19937 gen(1000u + 17u * uint32_t(rank) + uint32_t(c.hidden));
  std::uniform_real_distribution<float> gate(0.05f, 1.f);
  for (int t = 0; t < r.tokens; ++t) {
    std::vector<int> pool(c.experts);
    for (int e = 0; e < c.experts; ++e) pool[e] = e;
    // one_group: every token picks its experts among the first k (one rank's group holds them all).
    if (c.routing != Routing::one_group) std::shuffle(pool.begin(), pool.end(), gen);
    for (int j = 0; j < c.topk; ++j) {
      r.ids.push_back(pool[j]);
      r.gates.push_back(gate(gen));
    }
  }
  return r;
}

// Deterministic bf16 values: token rows x (rank, token, column) and expert outputs Y (rank, row, column).
bf16_bits value(uint32_t a, uint32_t b, uint32_t col, uint32_t salt) {
  uint32_t h = a * 0x9e3779b1u ^ (b + 0x7f4a7c15u) * 0x85ebca77u ^ (col + salt) * 0xc2b2ae3du;
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 12;
  return float_to_bf16(float(int(h % 2001u) - 1000) / 1000.f);
}

struct Config {
  PlanConfig plan;
  int world = 0;
  int max_tokens = 0;
};
Config config_of(const Case& c, int world, int rank) {
  Config k;
  k.world = world;
  k.max_tokens = (c.tokens + 31) / 32 * 32;
  k.plan.shape.hidden = c.hidden;
  k.plan.shape.ffn = 256;
  k.plan.shape.num_experts = c.experts;
  k.plan.shape.topk = c.topk;
  k.plan.par.tp = c.tp;
  k.plan.par.ep = world / c.tp;
  k.plan.rank = rank;
  k.plan.tile_m = 128;
  k.plan.cap.max_tokens_per_rank = k.max_tokens;
  const int local = c.experts / k.plan.par.ep;
  const int rows = world * k.max_tokens * std::min(c.topk, local) + local * 128;
  k.plan.cap.max_rows = (rows + 127) / 128 * 128;
  return k;
}

// ---- the kernels: the roles and nothing else -------------------------------------------------------
template <class Transport>
__global__ void dispatch_kernel(kernels::DispatchArgs d, kernels::Epoch epoch, int smem_bytes, TeamDeviceView team,
                                Transport tr) {
  extern __shared__ __align__(1024) char smem[];
  kernels::run_dispatch_role<Transport>(d, blockIdx.x, gridDim.x, epoch, smem, smem_bytes, team, tr);
}

template <class Transport>
__global__ void combine_kernel(kernels::CombineArgs c, kernels::Epoch epoch, int smem_bytes, TeamDeviceView team,
                               Transport tr) {
  extern __shared__ __align__(1024) char smem[];
  kernels::run_combine_role<Transport>(c, blockIdx.x, gridDim.x, epoch, /*wait_done=*/false, smem, smem_bytes, team, tr);
}

constexpr int kDispatchThreads = kernels::dispatch::kWarpsUsed * 32;
constexpr int kCombineThreads = 256;
constexpr int kCombineSmem = kCombineThreads / 32 * 2 * kernels::kCombineSlices * kernels::kCombineSliceBytes;

std::vector<void*> g_allocations;  // this case's cudaMalloc'ed buffers, freed at its end

template <class T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  PE_CUDA(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)));
  g_allocations.push_back(p);
  return p;
}
template <class T>
T* device_copy(const std::vector<T>& v) {
  T* p = device_alloc<T>(v.size());
  if (!v.empty()) PE_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <class T>
std::vector<T> host_copy(const T* p, size_t n) {
  std::vector<T> v(n);
  PE_CUDA(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Runs launch() `reps` times on the legacy stream; the mean time of the calls after the first (every
// call writes the same values, so the checks read what the first one wrote).
template <class Launch>
float mean_ms_after_first(int reps, Launch&& launch) {
  cudaEvent_t e0, e1;
  PE_CUDA(cudaEventCreate(&e0));
  PE_CUDA(cudaEventCreate(&e1));
  for (int rep = 0; rep < reps; ++rep) {
    if (rep == 1) PE_CUDA(cudaEventRecord(e0));
    launch();
    PE_CUDA(cudaGetLastError());
  }
  PE_CUDA(cudaEventRecord(e1));
  PE_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  PE_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  PE_CUDA(cudaEventDestroy(e0));
  PE_CUDA(cudaEventDestroy(e1));
  return ms / float(reps - 1);
}

struct Failures {
  std::vector<std::string> what;
  void add(const std::string& s) {
    if (what.size() < 20) what.push_back(s);
  }
};

// ---- the fused layers (one GEMM + comm kernel each), both transports --------------------------------
// Layer 0: A holds the local units' rows (what the scatter kernel puts there), the comm blocks pull the
// remote ones, the compute blocks run swiglu(A W0_e^T) into hid. Layer 1: hid W1_e^T into Y while the
// comm blocks combine Y's finished column blocks into the owners. The peer-pointer run is comet's
// product path (launch_layer0 / launch_layer1, checked against the CPU reference by the GPU suite);
// the NVSHMEM run must give the same bits: hid, A, each receive buffer and the self partial.
constexpr int kFusedCommBlocks[2] = {4, 3};  // [peer, nvshmem]
constexpr int kFusedFfn = 512;

void run_fused(const Case& c, const Config& cfg, const PlanView& hp, const kernels::DispatchArgs& d0,
               const kernels::CombineArgs& cb0, __nv_bfloat16* x, __nv_bfloat16* a, __nv_bfloat16* recv,
               __nv_bfloat16* staging, const TeamDeviceView& team, kernels::Epoch& epoch, int tile_n,
               float (&ms)[2][2], Failures& fail) {
  const int H = c.hidden, F = kFusedFfn, n0 = 2 * F, k = c.topk, world = cfg.world, T = cfg.max_tokens;
  const int experts = c.experts / cfg.plan.par.ep, rows_cap = cfg.plan.cap.max_rows;
  const int max_tiles = rows_cap / 128, n_blocks = (H + tile_n - 1) / tile_n;
  const std::string at = " (tile 128x" + std::to_string(tile_n) + ")";
  const int pe = cfg.plan.rank;
  // Weights: small values, so that hid and Y stay in bf16's comfortable range.
  std::vector<bf16_bits> w0(size_t(experts) * n0 * H), w1(size_t(experts) * H * F);
  for (size_t i = 0; i < w0.size(); ++i) w0[i] = float_to_bf16(bf16_to_float(value(7, uint32_t(i), 0, 3)) * 0.05f);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = float_to_bf16(bf16_to_float(value(9, uint32_t(i), 0, 4)) * 0.05f);
  const bf16_bits* dw0 = device_copy(w0);
  const bf16_bits* dw1 = device_copy(w1);
  auto* hid = device_alloc<__nv_bfloat16>(size_t(rows_cap) * F);
  auto* y = device_alloc<__nv_bfloat16>(size_t(rows_cap) * H);
  auto* self_partial = device_alloc<__nv_bfloat16>(size_t(T) * H);
  kernels::Epoch* tile_done = device_copy(std::vector<kernels::Epoch>(size_t(max_tiles) * n_blocks, 0));
  kernels::Epoch* d_epoch = device_alloc<kernels::Epoch>(1);
  // The local units' rows of A, as the scatter kernel leaves them.
  std::vector<bf16_bits> a_local(size_t(rows_cap) * H, 0);
  for (int u = 0; u < *hp.num_local_units; ++u)
    for (int j = 0; j < k; ++j) {
      const int row = hp.unit_rows[size_t(u) * k + j];
      if (row >= 0)
        for (int col = 0; col < H; ++col) a_local[size_t(row) * H + col] = value(pe, hp.unit_token[u], col, 1);
    }

  std::vector<bf16_bits> hid_out[2], a_out[2], recv_out[2], self_out[2];
  for (int tr = 0; tr < 2; ++tr) {
    kernels::GridSplit split;
    split.epoch = d_epoch;
    split.n_comm = kFusedCommBlocks[tr];
    split.m_group = 4;
    split.n_group = 1;
    split.mode = kernels::Mode::fused;
    split.team = team;
    kernels::Layer0Launch l0;
    l0.tile_n = tile_n;
    l0.hidden = H;
    l0.w0 = dw0;
    l0.n0 = n0;
    l0.experts = experts;
    l0.rows_cap = rows_cap;
    l0.hid = hid;
    l0.hid_ld = F;
    l0.act = kernels::EpilogueOp::swiglu;
    l0.dispatch = d0;  // peer_x as the role runs left it: set below per transport
    l0.split = split;
    kernels::Layer1Launch l1;
    l1.tile_n = tile_n;
    l1.hid = hid;
    l1.ffn_shard = F;
    l1.w1 = dw1;
    l1.experts = experts;
    l1.rows_cap = rows_cap;
    l1.y = y;
    l1.tile_done = tile_done;
    l1.combine = cb0;
    l1.combine.y = y;
    l1.combine.self_partial = self_partial;
    l1.combine.tile_n = tile_n;
    l1.combine.n_blocks = n_blocks;
    l1.split = split;
    // The transports' addresses: peer pointers from nvshmem_ptr, or this PE's own symmetric ones.
    std::vector<const __nv_bfloat16*> px(world);
    std::vector<__nv_bfloat16*> pr(world);
    for (int r = 0; r < world; ++r) {
      px[r] = tr == 0 ? static_cast<const __nv_bfloat16*>(nvshmem_ptr(x, r)) : x;
      pr[r] = tr == 0 ? static_cast<__nv_bfloat16*>(nvshmem_ptr(recv, r)) : recv;
    }
    l0.dispatch.peer_x = device_copy(px);
    l1.combine.peer_recv = device_copy(pr);
    const kernels::nvshmem::TransportArgs targs{0, staging};

    PE_CUDA(cudaMemcpy(a, a_local.data(), a_local.size() * 2, cudaMemcpyHostToDevice));
    PE_CUDA(cudaMemset(hid, 0, size_t(rows_cap) * F * 2));
    PE_CUDA(cudaMemset(recv, 0, size_t(world) * T * H * 2));
    PE_CUDA(cudaMemset(self_partial, 0, size_t(T) * H * 2));
    PE_CUDA(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    cudaEvent_t ev[3];
    for (auto& e : ev) PE_CUDA(cudaEventCreate(&e));
    ++epoch;
    PE_CUDA(cudaMemcpy(d_epoch, &epoch, sizeof(epoch), cudaMemcpyHostToDevice));
    PE_CUDA(cudaEventRecord(ev[0]));
    if (tr == 0)
      kernels::launch_layer0(l0, nullptr);
    else
      kernels::nvshmem::launch_layer0(l0, targs, nullptr);
    PE_CUDA(cudaEventRecord(ev[1]));
    if (tr == 0)
      kernels::launch_layer1(l1, nullptr);
    else
      kernels::nvshmem::launch_layer1(l1, targs, nullptr);
    PE_CUDA(cudaEventRecord(ev[2]));
    PE_CUDA(cudaEventSynchronize(ev[2]));
    PE_CUDA(cudaEventElapsedTime(&ms[0][tr], ev[0], ev[1]));
    PE_CUDA(cudaEventElapsedTime(&ms[1][tr], ev[1], ev[2]));
    for (auto& e : ev) PE_CUDA(cudaEventDestroy(e));
    const DeviceStatus st = host_copy(team.status, 1)[0];
    if (st.code != 0)
      fail.add(std::string("fused (") + (tr ? "nvshmem" : "peer") + ")" + at + ": device status code " +
               std::to_string(st.code) + " site " + std::to_string(st.site) + " index " + std::to_string(st.index));
    nvshmem_barrier_all();  // every rank's layer 1 has shipped
    hid_out[tr] = host_copy(reinterpret_cast<const bf16_bits*>(hid), size_t(rows_cap) * F);
    a_out[tr] = host_copy(reinterpret_cast<const bf16_bits*>(a), size_t(rows_cap) * H);
    recv_out[tr] = host_copy(reinterpret_cast<const bf16_bits*>(recv), size_t(world) * T * H);
    self_out[tr] = host_copy(reinterpret_cast<const bf16_bits*>(self_partial), size_t(T) * H);
  }
  // The peer run did real work (rows of hid are not all zero where A has rows), and the NVSHMEM run
  // gave the same bits everywhere.
  long long nonzero = 0;
  for (bf16_bits v : hid_out[0]) nonzero += (v & 0x7fff) != 0;
  if (hp.expert_offset[experts] > 0 && nonzero == 0) fail.add("fused (peer)" + at + ": hid is all zero");
  if (a_out[0] != a_out[1]) fail.add("fused layer 0" + at + ": A differs between the transports");
  if (hid_out[0] != hid_out[1]) fail.add("fused layer 0" + at + ": hid differs between the transports");
  if (recv_out[0] != recv_out[1]) fail.add("fused layer 1" + at + ": the receive buffer differs between the transports");
  if (self_out[0] != self_out[1]) fail.add("fused layer 1" + at + ": the self partial differs between the transports");
}

// ---- one case on this PE -------------------------------------------------------------------------
bool run_case(const Case& c, int pe, int world) {
  const Config cfg = config_of(c, world, pe);
  const int H = c.hidden, k = c.topk, T = cfg.max_tokens;
  std::vector<RankRouting> routing;
  std::vector<RoutingView> views;
  for (int r = 0; r < world; ++r) routing.push_back(routing_of(c, r, world));
  for (const auto& r : routing) views.push_back(RoutingView{r.tokens, r.ids.data(), r.gates.data()});
  std::vector<HostPlan> plans;  // every rank's: the combine check needs the senders'
  for (int r = 0; r < world; ++r) {
    PlanConfig pc = cfg.plan;
    pc.rank = r;
    plans.push_back(build_plan_host(pc, views));
  }
  const HostPlan& mine = plans[pe];
  const PlanView& hp = mine.view();
  const int units = *hp.num_units, local_units = *hp.num_local_units, tiles = *hp.num_tiles;
  const int rows_cap = cfg.plan.cap.max_rows;

  // The plan on the device: the same carving on a device block, filled from the host arrays.
  // (status is the first array, so it is where the host block starts.)
  void* plan_block = device_alloc<std::byte>(mine.bytes());
  const PlanView dp = carve_plan(cfg.plan, plan_block);
  PE_CUDA(cudaMemcpy(plan_block, hp.status, mine.bytes(), cudaMemcpyHostToDevice));

  // Symmetric buffers (same sizes on every PE): token rows x, the gathered buffer A (NVSHMEM gets
  // write it), the receive buffers [W][T][H] and the combine's put staging.
  const int dispatch_blocks[2] = {4, 3}, combine_blocks[2] = {4, 3};  // [peer, nvshmem]: n_comm differs
  auto* x = static_cast<__nv_bfloat16*>(nvshmem_malloc(size_t(T) * H * 2));
  auto* a = static_cast<__nv_bfloat16*>(nvshmem_malloc(size_t(rows_cap) * H * 2));
  auto* recv = static_cast<__nv_bfloat16*>(nvshmem_malloc(size_t(world) * T * H * 2));
  const size_t staging_bytes =
      std::max(kernels::NvshmemTransport::staging_bytes(combine_blocks[1] * kCombineThreads / 32),
               kernels::nvshmem::staging_bytes(kFusedCommBlocks[1]));
  auto* staging = static_cast<__nv_bfloat16*>(nvshmem_malloc(staging_bytes));
  if (!x || !a || !recv || !staging) {
    std::printf("pe %d: nvshmem_malloc failed\n", pe);
    return false;
  }
  {
    std::vector<bf16_bits> hx(size_t(T) * H, 0);
    for (int t = 0; t < routing[pe].tokens; ++t)
      for (int col = 0; col < H; ++col) hx[size_t(t) * H + col] = value(pe, t, col, 1);
    PE_CUDA(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  }
  auto y_value = [&](int r, int row, int col) { return value(r, row, col, 2); };
  std::vector<bf16_bits> hy(size_t(rows_cap) * H);
  for (int row = 0; row < rows_cap; ++row)
    for (int col = 0; col < H; ++col) hy[size_t(row) * H + col] = y_value(pe, row, col);
  auto* y = reinterpret_cast<__nv_bfloat16*>(device_copy(hy));
  auto* self_partial = device_alloc<__nv_bfloat16>(size_t(T) * H);
  const int max_tiles = rows_cap / 128;
  int32_t* tile_arrived = device_copy(std::vector<int32_t>(max_tiles, 0));
  kernels::Epoch* tile_ready = device_copy(std::vector<kernels::Epoch>(max_tiles, 0));
  DeviceStatus* status = device_copy(std::vector<DeviceStatus>(1, DeviceStatus{}));
  const TeamDeviceView team{pe, world, status, 10'000'000'000ull};  // 10 s: a stall reports, never hangs

  // Peer addresses per transport: mapped pointers, or this PE's own symmetric address for every rank.
  std::vector<const __nv_bfloat16*> peer_x(world), sym_x(world, x);
  std::vector<__nv_bfloat16*> peer_recv(world), sym_recv(world, recv);
  for (int r = 0; r < world; ++r) {
    peer_x[r] = static_cast<const __nv_bfloat16*>(nvshmem_ptr(x, r));
    peer_recv[r] = static_cast<__nv_bfloat16*>(nvshmem_ptr(recv, r));
    if (!peer_x[r] || !peer_recv[r]) {
      std::printf("pe %d: nvshmem_ptr gives no pointer to pe %d (one node expected)\n", pe, r);
      return false;
    }
  }
  const __nv_bfloat16* const* d_peer_x = device_copy(peer_x);
  const __nv_bfloat16* const* d_sym_x = device_copy(sym_x);
  __nv_bfloat16* const* d_peer_recv = device_copy(peer_recv);
  __nv_bfloat16* const* d_sym_recv = device_copy(sym_recv);

  kernels::DispatchArgs d{};
  d.a = a;
  d.hidden = H;
  d.topk = k;
  d.tile_m = 128;
  d.plan = dp;
  d.tile_arrived = tile_arrived;
  d.tile_ready = tile_ready;
  d.unit_begin = d.unit_end = -1;
  d.store_lag = 2;
  const int row_bytes = H * 2;
  const int dispatch_smem = kernels::dispatch::kRowsOffset + 16 * row_bytes;
  PE_CUDA(cudaFuncSetAttribute(dispatch_kernel<kernels::PeerTransport>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               dispatch_smem));
  PE_CUDA(cudaFuncSetAttribute(dispatch_kernel<kernels::NvshmemTransport>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, dispatch_smem));

  kernels::CombineArgs cb{};
  cb.y = y;
  cb.self_partial = self_partial;
  cb.hidden = H;
  cb.topk = k;
  cb.tile_m = 128;
  cb.tile_n = 256;
  cb.n_blocks = (H + 255) / 256;
  cb.max_tokens = T;
  cb.rank = pe;
  cb.plan = dp;
  cb.unit_begin = cb.unit_end = -1;
  cb.world = world;
  cb.expected_slots = kernels::expected_slots_per_unit(k, cfg.plan.par.ep, c.experts);
  PE_CUDA(cudaFuncSetAttribute(combine_kernel<kernels::PeerTransport>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kCombineSmem));
  PE_CUDA(cudaFuncSetAttribute(combine_kernel<kernels::NvshmemTransport>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kCombineSmem));
  kernels::NvshmemTransport nv;
  nv.pe_base = 0;
  nv.staging = staging;

  Failures fail;
  auto check_status = [&](const char* what) {
    const DeviceStatus s = host_copy(status, 1)[0];
    if (s.code != 0)
      fail.add(std::string(what) + ": device status code " + std::to_string(s.code) + " site " +
               std::to_string(s.site) + " index " + std::to_string(s.index));
  };

  // ---- dispatch, both transports ----
  std::vector<bf16_bits> a_out[2];
  float dispatch_ms[2] = {0, 0};
  kernels::Epoch epoch = 0;
  for (int tr = 0; tr < 2; ++tr) {
    PE_CUDA(cudaMemset(a, 0, size_t(rows_cap) * H * 2));
    PE_CUDA(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    d.peer_x = tr == 0 ? d_peer_x : d_sym_x;
    dispatch_ms[tr] = mean_ms_after_first(4, [&] {
      ++epoch;  // each call a new generation of the tile flags
      if (tr == 0)
        dispatch_kernel<<<dispatch_blocks[0], kDispatchThreads, dispatch_smem>>>(d, epoch, dispatch_smem, team,
                                                                               kernels::PeerTransport{});
      else
        dispatch_kernel<<<dispatch_blocks[1], kDispatchThreads, dispatch_smem>>>(d, epoch, dispatch_smem, team, nv);
    });
    check_status(tr == 0 ? "dispatch (peer)" : "dispatch (nvshmem)");
    a_out[tr] = host_copy(reinterpret_cast<const bf16_bits*>(a), size_t(rows_cap) * H);
    const auto ready = host_copy(tile_ready, max_tiles);
    for (int m = 0; m < tiles; ++m)
      if (hp.tile_remote_rows[m] > 0 && ready[m] != epoch)
        fail.add("tile_ready[" + std::to_string(m) + "] = " + std::to_string(ready[m]) + ", not the epoch");
  }
  // Expected A: remote units' rows are their owners' token rows; every other row untouched (zero).
  std::vector<bf16_bits> a_want(size_t(rows_cap) * H, 0);
  long long pulled_rows = 0;
  for (int u = local_units; u < units; ++u)
    for (int j = 0; j < k; ++j) {
      const int row = hp.unit_rows[size_t(u) * k + j];
      if (row < 0) continue;
      ++pulled_rows;
      for (int col = 0; col < H; ++col) a_want[size_t(row) * H + col] = value(hp.unit_src[u], hp.unit_token[u], col, 1);
    }
  for (int tr = 0; tr < 2; ++tr)
    for (size_t i = 0; i < a_want.size(); ++i)
      if (a_out[tr][i] != a_want[i]) {
        fail.add(std::string("dispatch (") + (tr ? "nvshmem" : "peer") + "): A row " + std::to_string(i / H) +
                 " column " + std::to_string(i % H) + " wrong");
        break;
      }

  // ---- combine, both transports ----
  std::vector<bf16_bits> recv_out[2], self_out[2];
  float combine_ms[2] = {0, 0};
  for (int tr = 0; tr < 2; ++tr) {
    PE_CUDA(cudaMemset(recv, 0, size_t(world) * T * H * 2));
    PE_CUDA(cudaMemset(self_partial, 0, size_t(T) * H * 2));
    PE_CUDA(cudaDeviceSynchronize());
    nvshmem_barrier_all();  // nobody ships into a buffer still being zeroed
    cb.peer_recv = tr == 0 ? d_peer_recv : d_sym_recv;
    combine_ms[tr] = mean_ms_after_first(4, [&] {
      if (tr == 0)
        combine_kernel<<<combine_blocks[0], kCombineThreads, kCombineSmem>>>(cb, epoch, kCombineSmem, team,
                                                                            kernels::PeerTransport{});
      else
        combine_kernel<<<combine_blocks[1], kCombineThreads, kCombineSmem>>>(cb, epoch, kCombineSmem, team, nv);
    });
    check_status(tr == 0 ? "combine (peer)" : "combine (nvshmem)");
    nvshmem_barrier_all();  // every sender's slices are in (their kernels ended with end_combine)
    recv_out[tr] = host_copy(reinterpret_cast<const bf16_bits*>(recv), size_t(world) * T * H);
    self_out[tr] = host_copy(reinterpret_cast<const bf16_bits*>(self_partial), size_t(T) * H);
  }
  // Expected: for every sender r and each of its units owned here, the gate-weighted sum of its rows in
  // slot order (fp32), rounded to bf16; in recv[r][token], or the self partial for r == pe.
  std::vector<float> recv_want(size_t(world) * T * H, 0.f), self_want(size_t(T) * H, 0.f);
  long long shipped_slices = 0;
  for (int r = 0; r < world; ++r) {
    const PlanView& rp = plans[r].view();
    for (int u = 0; u < *rp.num_units; ++u) {
      if (rp.unit_src[u] == pe) {
        float* out = r == pe ? &self_want[size_t(rp.unit_token[u]) * H] : &recv_want[(size_t(r) * T + rp.unit_token[u]) * H];
        for (int col = 0; col < H; ++col) {
          float acc = 0.f;
          for (int j = 0; j < k; ++j) {
            const int row = rp.unit_rows[size_t(u) * k + j];
            if (row >= 0) acc = std::fma(rp.unit_gates[size_t(u) * k + j], bf16_to_float(y_value(r, row, col)), acc);
          }
          out[col] = round_to_bf16(acc);
        }
      }
      if (r == pe && rp.unit_src[u] != pe) shipped_slices += (H + 255) / 256;
    }
  }
  auto compare = [&](const std::vector<bf16_bits>& got, const std::vector<float>& want, const char* what) {
    for (size_t i = 0; i < want.size(); ++i) {
      const float g = bf16_to_float(got[i]), w = want[i];
      if (!(std::fabs(g - w) <= std::ldexp(std::max(std::fabs(w), 1e-3f), -7))) {  // one bf16 rounding
        fail.add(std::string(what) + ": element " + std::to_string(i) + " is " + std::to_string(g) + ", want " +
                 std::to_string(w));
        return;
      }
    }
  };
  compare(recv_out[0], recv_want, "combine (peer): receive buffer");
  compare(self_out[0], self_want, "combine (peer): self partial");
  if (recv_out[0] != recv_out[1] || self_out[0] != self_out[1])
    fail.add("combine: the NVSHMEM transport's output differs from the peer pointers' (not bitwise equal)");

  // The fused layers at every tile width the NVSHMEM transport has (the tuner may pick any).
  constexpr int kFusedTiles[3] = {256, 192, 128};
  float fused_ms[3][2][2] = {};
  if (c.fused)
    for (int i = 0; i < 3; ++i)
      run_fused(c, cfg, hp, d, cb, x, a, recv, staging, team, epoch, kFusedTiles[i], fused_ms[i], fail);

  // Rates per comm block (the two runs have different block counts): MB / ms / blocks = GB/s a block.
  const double pulled_mb = double(pulled_rows) * row_bytes / 1e6, shipped_mb = double(shipped_slices) * 512 / 1e6;
  auto per_block = [](double mb, float ms, int blocks) { return ms > 0 ? mb / ms / blocks : 0.0; };
  std::printf("pe %d %-20s dispatch %.2f MB: peer %.1f us (%.1f GB/s a block), nvshmem %.1f us (%.1f) | "
              "combine %.2f MB out: peer %.1f us (%.1f), nvshmem %.1f us (%.1f) | %s\n",
              pe, c.name, pulled_mb, dispatch_ms[0] * 1e3, per_block(pulled_mb, dispatch_ms[0], dispatch_blocks[0]),
              dispatch_ms[1] * 1e3, per_block(pulled_mb, dispatch_ms[1], dispatch_blocks[1]), shipped_mb,
              combine_ms[0] * 1e3, per_block(shipped_mb, combine_ms[0], combine_blocks[0]), combine_ms[1] * 1e3,
              per_block(shipped_mb, combine_ms[1], combine_blocks[1]), fail.what.empty() ? "ok" : "FAIL");
  if (c.fused)
    for (int i = 0; i < 3; ++i)
      std::printf("pe %d %-20s tile 128x%d: fused layer 0: peer %.1f us, nvshmem %.1f us | fused layer 1: peer %.1f us, "
                  "nvshmem %.1f us\n",
                  pe, c.name, kFusedTiles[i], fused_ms[i][0][0] * 1e3, fused_ms[i][0][1] * 1e3, fused_ms[i][1][0] * 1e3,
                  fused_ms[i][1][1] * 1e3);
  for (const auto& w : fail.what) std::printf("pe %d %s: %s\n", pe, c.name, w.c_str());
  std::fflush(stdout);

  nvshmem_barrier_all();
  nvshmem_free(staging);
  nvshmem_free(recv);
  nvshmem_free(a);
  nvshmem_free(x);
  for (void* p : g_allocations) cudaFree(p);
  g_allocations.clear();
  return fail.what.empty();
}

std::vector<Case> cases_for(int world) {
  std::vector<Case> cs = {
      {"ep_top2_h1024", 1024, 4 * world, 2, 300, 1, Routing::uniform, true},
      {"ep_top8_h1000", 1000, 8 * world, 8, 200, 1, Routing::uniform},
      {"ep_top1_one_group", 512, 2 * world, 1, 150, 1, Routing::one_group, true},
      {"ep_top8_one_group", 768, 8 * world, 8, 130, 1, Routing::one_group},
      {"ep_top2_empty_rank", 1024, 4 * world, 2, 257, 1, Routing::empty_rank, true},
  };
  if (world % 2 == 0) cs.push_back({"ep_tp2_top4", 1024, 4 * world, 4, 200, 2, Routing::uniform, true});
  return cs;
}

int run_pe(int pe, int world, const std::string& id_path) {
  g_pe = pe;
  PE_CUDA(cudaSetDevice(0));
  nvshmemx_uniqueid_t id;
  std::memset(&id, 0, sizeof(id));
  if (!harness::share_bytes(pe, id_path, &id, sizeof(id), [&] { return nvshmemx_get_uniqueid(&id) == 0; })) {
    std::printf("pe %d: no unique id (from nvshmemx_get_uniqueid on PE 0)\n", pe);
    return 4;
  }
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  nvshmemx_set_attr_uniqueid_args(pe, world, &id, &attr);
  // The host library alone, as SymmetricHeap::nvshmem initialises it; then each module whose kernels
  // call NVSHMEM gets its device state: this file's role kernels and comet's fused kernels.
  if (nvshmemx_hostlib_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0) return 8;
  try {
    team_detail::NvshmemHeap::bind_module(reinterpret_cast<const void*>(dispatch_kernel<kernels::NvshmemTransport>));
    kernels::nvshmem::bind_fused_kernels();
  } catch (const std::exception& e) {
    std::printf("pe %d: %s\n", pe, e.what());
    return 9;
  }
  int failed = 0;
  for (const Case& c : cases_for(world)) failed += !run_case(c, pe, world);
  nvshmemx_hostlib_finalize();
  return failed ? 7 : 0;
}

}  // namespace
}  // namespace comet

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU: skipped\n");
    return 77;
  }
  const int world = argc > 1 ? std::atoi(argv[1]) : 2;
  if (const int pe = comet::harness::pe_from_env(); pe >= 0) return comet::run_pe(pe, world, comet::harness::id_path_from_env());
  if (world < 1 || world > 8) {
    std::fprintf(stderr, "usage: comet_nvshmem_transport_tests [PEs 1-8]\n");
    return 2;
  }
  setenv("NVSHMEM_REMOTE_TRANSPORT", "none", 0);  // one node: peers through P2P only
  setenv("NVSHMEM_BOOTSTRAP", "UID", 0);
  const std::string plugin = std::string(COMET_NVSHMEM_LIBDIR) + "/nvshmem_bootstrap_uid.so.3";
  if (access(plugin.c_str(), R_OK) == 0) setenv("NVSHMEM_BOOTSTRAP_PLUGIN", plugin.c_str(), 0);
  // The roles' own waits are bounded by the team timeout; the alarm ends a PE stuck inside NVSHMEM.
  const int failed = comet::harness::spawn_pes(world, argv, 240);
  std::printf("%s: comm roles and fused layers over NVSHMEM vs peer pointers, %d PEs on one GPU, %d failed\n",
              failed ? "FAIL" : "PASS", world, failed);
  return failed ? 1 : 0;
}
