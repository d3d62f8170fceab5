#include "ops/cublas_gemms.hpp"

#include <cublas_v2.h>

#include <cstdlib>
#include <string>

#include "comet/cuda_check.hpp"
#include "util/shared_library.hpp"

namespace comet {
namespace {

// The cuBLAS entry points the backward uses, resolved once from the loaded library.
struct CublasApi : LoadedLibrary {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

CublasApi load() {
  CublasApi a;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("COMET_CUBLAS_LIB")) candidates.push_back(env);
  candidates.push_back("libcublas.so.13");
  candidates.push_back("/usr/local/cuda/lib64/libcublas.so.13");
  static_cast<LoadedLibrary&>(a) = load_first(candidates);
  if (!a.handle) return a;
  if (!(resolve_symbol(a, a.create, "cublasCreate_v2") && resolve_symbol(a, a.destroy, "cublasDestroy_v2") &&
        resolve_symbol(a, a.set_stream, "cublasSetStream_v2") && resolve_symbol(a, a.gemm_ex, "cublasGemmEx")))
    a.handle = nullptr;  // left loaded: cheaper than reasoning about a half-resolved library
  return a;
}

const CublasApi& api() {
  static const CublasApi a = load();
  COMET_REQUIRE(a.handle, "comet's cuBLAS GEMMs (MoeOptions::cublas_backward, a table's cublas pick): cuBLAS could ",
                "not be loaded (", a.error, "); set COMET_CUBLAS_LIB to libcublas.so.13");
  return a;
}

void check(cublasStatus_t s, const char* what) {
  COMET_REQUIRE(s == CUBLAS_STATUS_SUCCESS, "comet's cuBLAS GEMMs: ", what, " failed (cuBLAS status ", int(s),
                ")");
}

}  // namespace

// ---- CublasExpertGemms ----------------------------------------------------------------------------------

CublasExpertGemms::CublasExpertGemms() { api(); }

CublasExpertGemms::~CublasExpertGemms() {
  for (auto& [stream, h] : handles_) api().destroy(static_cast<cublasHandle_t>(h));
}

void* CublasExpertGemms::handle_for(cudaStream_t stream) {
  for (auto& [s, h] : handles_)
    if (s == stream) return h;
  cublasHandle_t h = nullptr;
  check(api().create(&h), "cublasCreate");
  check(api().set_stream(h, stream), "cublasSetStream");
  handles_.emplace_back(stream, h);
  return h;
}

// cuBLAS is column-major: a row-major [r][c] matrix is a column-major c x r one. So out_e [rows][n] is
// out^T (n x rows) = W (n x k) a_e^T (k x rows: a_e as stored, OP_N, ld k), where W is the product's
// right factor transposed: w_e [k][n] as stored (w_kn: column-major n x k, OP_N, ld n), or w_e stored
// [n][k] (column-major k x n, OP_T, ld k).
void CublasExpertGemms::data_gemm(cudaStream_t stream, const ExpertRows& e, const void* a, int k, const void* w,
                                  bool w_kn, int n, void* out) {
  auto h = static_cast<cublasHandle_t>(handle_for(stream));
  const float one = 1.f, zero = 0.f;
  for (size_t x = 0; x < e.rows.size(); ++x) {
    if (e.rows[x] == 0) continue;
    const auto* a_e = static_cast<const uint16_t*>(a) + size_t(e.offset[x]) * k;
    const auto* w_e = static_cast<const uint16_t*>(w) + x * size_t(k) * n;
    auto* out_e = static_cast<uint16_t*>(out) + size_t(e.offset[x]) * n;
    check(api().gemm_ex(h, w_kn ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, n, e.rows[x], k, &one, w_e, CUDA_R_16BF,
                        w_kn ? n : k, a_e, CUDA_R_16BF, k, &zero, out_e, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (expert GEMM)");
  }
}

// dw_e [p_cols][q_cols] = p_e^T q_e is, column-major, dw^T (q_cols x p_cols) = q_e^T (q_cols x rows, OP_N,
// ld q_cols) p_e (rows x p_cols: p_e^T stored column-major p_cols x rows, OP_T, ld p_cols).
void CublasExpertGemms::weight_grads(cudaStream_t stream, const ExpertRows& e, const void* p, int p_cols, const void* q,
                                     int q_cols, void* dw, bool f32, bool accumulate) {
  auto h = static_cast<cublasHandle_t>(handle_for(stream));
  const float one = 1.f, beta = accumulate ? 1.f : 0.f;
  const size_t elem = f32 ? 4 : 2, block = size_t(p_cols) * q_cols;
  for (size_t x = 0; x < e.rows.size(); ++x) {
    void* dw_e = static_cast<char*>(dw) + x * block * elem;
    if (e.rows[x] == 0) {
      if (!accumulate) COMET_CUDA_CHECK(cudaMemsetAsync(dw_e, 0, block * elem, stream));
      continue;
    }
    const auto* p_e = static_cast<const uint16_t*>(p) + size_t(e.offset[x]) * p_cols;
    const auto* q_e = static_cast<const uint16_t*>(q) + size_t(e.offset[x]) * q_cols;
    check(api().gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_T, q_cols, p_cols, e.rows[x], &one, q_e, CUDA_R_16BF, q_cols, p_e,
                        CUDA_R_16BF, p_cols, &beta, dw_e, f32 ? CUDA_R_32F : CUDA_R_16BF, q_cols, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (weight gradient)");
  }
}

}  // namespace comet
