// A shared library loaded at run time (dlopen) from a list of candidates, and its symbols resolved: how
// comet reaches NVSHMEM's host library (team/nvshmem_heap.cpp) and cuBLAS (ops/cublas_gemms.cpp) without
// a link dependency on them. Internal, header-only.
#pragma once

#include <dlfcn.h>

#include <string>
#include <vector>

namespace comet {

struct LoadedLibrary {
  void* handle = nullptr;
  std::string path;   // the candidate that was loaded
  std::string error;  // why none was, or which symbol is missing
};

// The first candidate dlopen (RTLD_NOW | RTLD_GLOBAL) loads; `error` collects every refusal where none does.
inline LoadedLibrary load_first(const std::vector<std::string>& candidates) {
  LoadedLibrary lib;
  for (const std::string& c : candidates) {
    lib.handle = dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (lib.handle) {
      lib.path = c;
      lib.error.clear();
      return lib;
    }
    lib.error += (lib.error.empty() ? "" : "; ") + std::string(dlerror());
  }
  return lib;
}

// fn = the symbol `name` of the loaded library; false (and `error` says which) where it has none.
template <class F>
bool resolve_symbol(LoadedLibrary& lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib.handle, name));
  if (!fn) lib.error = std::string("symbol ") + name + " missing in " + lib.path;
  return fn != nullptr;
}

}  // namespace comet
