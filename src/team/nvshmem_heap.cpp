// NvshmemHeap (nvshmem_heap.hpp): NVSHMEM's host library, loaded at run time.
#include "team/nvshmem_heap.hpp"

#include "comet/common.hpp"
#include "comet/cuda_check.hpp"
#include "util/shared_library.hpp"

#if COMET_HAVE_NVSHMEM
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>
#endif

namespace comet::team_detail {

#if COMET_HAVE_NVSHMEM

namespace {

// The host-library calls comet makes, resolved from the loaded library.
struct Api : LoadedLibrary {
  int (*get_uniqueid)(nvshmemx_uniqueid_t*) = nullptr;
  int (*set_uniqueid_args)(int, int, const nvshmemx_uniqueid_t*, nvshmemx_init_attr_t*) = nullptr;
  int (*hostlib_init_attr)(unsigned int, nvshmemx_init_attr_t*) = nullptr;
  void (*hostlib_finalize)() = nullptr;
  int (*my_pe)() = nullptr;
  int (*n_pes)() = nullptr;
  void* (*malloc)(size_t) = nullptr;
  void* (*ptr)(const void*, int) = nullptr;
  void (*free)(void*) = nullptr;
  int (*buffer_register)(void*, size_t) = nullptr;
  int (*buffer_unregister)(void*) = nullptr;
};

Api load() {
  Api a;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("COMET_NVSHMEM_LIB")) candidates.push_back(env);
  candidates.push_back("libnvshmem_host.so.3");
  candidates.push_back(std::string(COMET_NVSHMEM_LIBDIR) + "/libnvshmem_host.so.3");
  static_cast<LoadedLibrary&>(a) = load_first(candidates);
  if (!a.handle) return a;
  const bool ok = resolve_symbol(a, a.get_uniqueid, "nvshmemx_get_uniqueid") &&
                  resolve_symbol(a, a.set_uniqueid_args, "nvshmemx_set_attr_uniqueid_args") &&
                  resolve_symbol(a, a.hostlib_init_attr, "nvshmemx_hostlib_init_attr") &&
                  resolve_symbol(a, a.hostlib_finalize, "nvshmemx_hostlib_finalize") &&
                  resolve_symbol(a, a.my_pe, "nvshmem_my_pe") &&
                  resolve_symbol(a, a.n_pes, "nvshmem_n_pes") && resolve_symbol(a, a.malloc, "nvshmem_malloc") &&
                  resolve_symbol(a, a.ptr, "nvshmem_ptr") && resolve_symbol(a, a.free, "nvshmem_free") &&
                  resolve_symbol(a, a.buffer_register, "nvshmemx_buffer_register") &&
                  resolve_symbol(a, a.buffer_unregister, "nvshmemx_buffer_unregister");
  if (!ok) {
    dlclose(a.handle);
    a.handle = nullptr;
  }
  return a;
}

const Api& api() {
  static const Api a = load();
  return a;
}

const Api& loaded_api() {
  const Api& a = api();
  COMET_REQUIRE(a.handle, "NVSHMEM's host library could not be loaded (", a.error,
                "); set COMET_NVSHMEM_LIB to libnvshmem_host.so.3 (pip install nvidia-nvshmem-cu13==3.4.5, the version torch 2.11 uses)");
  return a;
}

std::atomic<bool> g_in_use{false};

bool hide_peers() {
  const char* v = std::getenv("COMET_NVSHMEM_PEER_POINTERS");
  return v && std::string(v) == "0";
}
std::atomic<int> g_session{0};

// NVSHMEM dlopen()s its bootstrap plugin by name: point it at the one next to the host library (the
// wheel keeps them together), unless the environment chose one. The team is one node for now: no
// remote transport unless the environment asks for one.
void default_environment(const Api& a) {
  if (!std::getenv("NVSHMEM_BOOTSTRAP_PLUGIN")) {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(a.malloc), &info) && info.dli_fname) {
      std::string dir = info.dli_fname;
      dir = dir.substr(0, dir.find_last_of('/') + 1);
      const std::string plugin = dir + "nvshmem_bootstrap_uid.so.3";
      struct stat st {};
      if (stat(plugin.c_str(), &st) == 0) setenv("NVSHMEM_BOOTSTRAP_PLUGIN", plugin.c_str(), 0);
    }
  }
  setenv("NVSHMEM_REMOTE_TRANSPORT", "none", 0);
}

}  // namespace

bool NvshmemHeap::available() { return api().handle != nullptr; }

void NvshmemHeap::init(int rank, int world, const AllGatherFn& all_gather) {
  const Api& a = loaded_api();
  bool expected = false;
  COMET_REQUIRE(g_in_use.compare_exchange_strong(expected, true),
                "IpcTeam(SymmetricHeap::nvshmem): this process already has an NVSHMEM team; close it first");
  try {
    nvshmemx_uniqueid_t id;
    std::memset(&id, 0, sizeof(id));
    if (rank == 0) COMET_REQUIRE(a.get_uniqueid(&id) == 0, "NVSHMEM: nvshmemx_get_uniqueid failed");
    std::vector<nvshmemx_uniqueid_t> all(world);
    all_gather(&id, all.data(), sizeof(id));
    default_environment(a);
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    COMET_REQUIRE(a.set_uniqueid_args(rank, world, &all[0], &attr) == 0,
                  "NVSHMEM: nvshmemx_set_attr_uniqueid_args failed for rank ", rank, " of ", world);
    COMET_REQUIRE(a.hostlib_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) == 0, "NVSHMEM: initialisation failed on rank ",
                  rank, " (NVSHMEM_DEBUG=INFO says why)");
    COMET_REQUIRE(a.my_pe() == rank && a.n_pes() == world, "NVSHMEM: PE ", a.my_pe(), " of ", a.n_pes(), " for rank ",
                  rank, " of ", world);
    ++g_session;
  } catch (...) {
    g_in_use = false;
    throw;
  }
}

void* NvshmemHeap::alloc(size_t bytes) {
  void* p = loaded_api().malloc(bytes);
  COMET_REQUIRE(p != nullptr, "NVSHMEM: nvshmem_malloc(", bytes,
                ") returned null (symmetric heap exhausted? NVSHMEM_SYMMETRIC_SIZE sets it)");
  return p;
}

void* NvshmemHeap::peer(void* local, int pe) {
  const Api& a = loaded_api();
  if (pe != a.my_pe() && hide_peers()) return nullptr;
  return a.ptr(local, pe);
}

void NvshmemHeap::free(void* local) { loaded_api().free(local); }

void NvshmemHeap::finalize() {
  loaded_api().hostlib_finalize();
  g_in_use = false;
}

void* NvshmemHeap::culibrary_init() {
  const Api& a = loaded_api();
  void* fn = dlsym(a.handle, "nvshmemx_culibrary_init");
  COMET_REQUIRE(fn != nullptr, "NVSHMEM: ", a.path, " has no nvshmemx_culibrary_init (NVSHMEM 3.4.5 has it)");
  return fn;
}

int NvshmemHeap::session() { return g_session.load(); }

void NvshmemHeap::bind_module(const void* kernel) {
  using CulibraryInit = int (*)(CUlibrary);
  const auto init = reinterpret_cast<CulibraryInit>(culibrary_init());
  COMET_REQUIRE(kernel != nullptr, "NVSHMEM: bind_module needs a kernel of the module");
  cudaKernel_t handle = nullptr;
  COMET_CUDA_CHECK(cudaGetKernel(&handle, kernel));
  // The driver call through the runtime's entry point: comet links no libcuda (binaries load where no
  // driver is installed).
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  COMET_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuKernelGetLibrary", &fn, 12050, cudaEnableDefault, &found));
  COMET_REQUIRE(fn != nullptr && found == cudaDriverEntryPointSuccess,
                "NVSHMEM: the driver has no cuKernelGetLibrary (needs CUDA 12.5 or later)");
  CUlibrary library = nullptr;
  const CUresult got = reinterpret_cast<CUresult (*)(CUlibrary*, CUkernel)>(fn)(&library, reinterpret_cast<CUkernel>(handle));
  COMET_REQUIRE(got == CUDA_SUCCESS, "NVSHMEM: cuKernelGetLibrary failed (CUresult ", int(got), ")");
  const int rc = init(library);
  COMET_REQUIRE(rc == 0, "NVSHMEM: nvshmemx_culibrary_init failed (", rc, "); is NVSHMEM initialised?");
}

bool NvshmemHeap::remote_transport() {
  const char* v = std::getenv("NVSHMEM_REMOTE_TRANSPORT");
  return v && *v && std::string(v) != "none";
}

void NvshmemHeap::register_buffer(void* p, size_t bytes) {
  const int rc = loaded_api().buffer_register(p, bytes);
  COMET_REQUIRE(rc == 0, "NVSHMEM: nvshmemx_buffer_register(", p, ", ", bytes, " bytes) failed (", rc, ")");
}

void NvshmemHeap::unregister_buffer(void* p) noexcept {
  const Api& a = api();
  if (a.handle) a.buffer_unregister(p);
}

#else  // built without NVSHMEM's headers

namespace {
[[noreturn]] void absent() {
  throw InvalidArgument("comet was built without NVSHMEM (scripts/setup-deps fetches it into .deps/nvshmem; "
                        "COMET_NVSHMEM_ROOT points CMake elsewhere): use SymmetricHeap::cuda_ipc");
}
}  // namespace

bool NvshmemHeap::available() { return false; }
void NvshmemHeap::init(int, int, const AllGatherFn&) { absent(); }
void* NvshmemHeap::alloc(size_t) { absent(); }
void* NvshmemHeap::peer(void*, int) { absent(); }
void NvshmemHeap::free(void*) { absent(); }
void NvshmemHeap::finalize() { absent(); }
void* NvshmemHeap::culibrary_init() { absent(); }
int NvshmemHeap::session() { return 0; }
void NvshmemHeap::bind_module(const void*) { absent(); }
bool NvshmemHeap::remote_transport() { return false; }
void NvshmemHeap::register_buffer(void*, size_t) { absent(); }
void NvshmemHeap::unregister_buffer(void*) noexcept {}

#endif

}  // namespace comet::team_detail
