// Which GEMM cuBLAS runs for an expert GEMM, and how fast each of its candidates is (issue 16: our
// layer-1 GEMM trails cuBLAS's by 2-5 % at large sizes, and neither a tail split nor A-sharing block
// pairs closed it; docs/design-changes.md, "The tail wave"). For out[rows][n] = a[rows][k] w[n][k]^T in
// bf16 with fp32 accumulation, as the sequential baseline calls cublasGemmEx (column-major: the
// transposed product, m = n, n = rows), it prints cuBLASLt's heuristic candidates in its order with their
// configuration (tile, stages, cluster shape, split-K, swizzle, ...) and each one's time, then the time
// of cublasGemmEx's own choice for reference.
// Usage: comet_cublas_algo_probe ROWS N K [candidates=8] [reps=20]
//   e.g. Mixtral EP 8 layer 1 at 16384 tokens: comet_cublas_algo_probe 32768 4096 14336
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "comet/cuda_check.hpp"

namespace {

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "comet_cublas_algo_probe: %s failed (cuBLAS status %d)\n", what, int(s));
    std::exit(1);
  }
}

int config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  int value = 0;
  size_t written = 0;
  // An attribute this library version does not know reads as -1.
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) != CUBLAS_STATUS_SUCCESS)
    return -1;
  return value;
}

// Median milliseconds of `reps` calls of fn, after two unmeasured ones.
template <class Fn>
double median_ms(Fn&& fn, int reps) {
  cudaEvent_t a, b;
  COMET_CUDA_CHECK(cudaEventCreate(&a));
  COMET_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) fn();
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) {
    COMET_CUDA_CHECK(cudaEventRecord(a));
    fn();
    COMET_CUDA_CHECK(cudaEventRecord(b));
    COMET_CUDA_CHECK(cudaEventSynchronize(b));
    COMET_CUDA_CHECK(cudaEventElapsedTime(&t[i], a, b));
  }
  COMET_CUDA_CHECK(cudaEventDestroy(a));
  COMET_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: comet_cublas_algo_probe ROWS N K [candidates=8] [reps=20]\n");
    return 2;
  }
  const int rows = std::atoi(argv[1]), n = std::atoi(argv[2]), k = std::atoi(argv[3]);
  const int want = argc > 4 ? std::atoi(argv[4]) : 8;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 20;
  if (rows <= 0 || n <= 0 || k <= 0 || want <= 0 || reps <= 0) {
    std::fprintf(stderr, "comet_cublas_algo_probe: ROWS, N, K, candidates and reps must be positive\n");
    return 2;
  }
  void *a = nullptr, *w = nullptr, *out = nullptr, *workspace = nullptr;
  const size_t workspace_bytes = size_t(64) << 20;
  COMET_CUDA_CHECK(cudaMalloc(&a, size_t(rows) * k * 2));
  COMET_CUDA_CHECK(cudaMalloc(&w, size_t(n) * k * 2));
  COMET_CUDA_CHECK(cudaMalloc(&out, size_t(rows) * n * 2));
  COMET_CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
  COMET_CUDA_CHECK(cudaMemset(a, 0x3c, size_t(rows) * k * 2));  // bf16 1.1e-2-ish values: no denormals
  COMET_CUDA_CHECK(cudaMemset(w, 0x3c, size_t(n) * k * 2));
  const float alpha = 1.f, beta = 0.f;
  const double flops = 2.0 * rows * double(n) * k;

  // Column-major view of the row-major product: out^T [n x rows] = w [k x n]^T a^T [k x rows].
  cublasLtHandle_t lt;
  check(cublasLtCreate(&lt), "cublasLtCreate");
  cublasLtMatmulDesc_t op;
  check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)), "TRANSA");
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)), "TRANSB");
  cublasLtMatrixLayout_t la, lb, lc;
  check(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k), "layout w");
  check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, rows, k), "layout a");
  check(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, rows, n), "layout out");
  cublasLtMatmulPreference_t pref;
  check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                             sizeof(workspace_bytes)),
        "workspace preference");
  std::vector<cublasLtMatmulHeuristicResult_t> found(want);
  int got = 0;
  check(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, want, found.data(), &got), "heuristic");

  std::printf("rows %d  N %d  K %d: %d candidates from cuBLASLt's heuristic, in its order\n", rows, n, k, got);
  std::printf("  #  algo  tile  stages  cluster  inner  splitK  reduction  swizzle  custom  waves      ms  TFLOP/s\n");
  for (int i = 0; i < got; ++i) {
    const cublasLtMatmulAlgo_t& algo = found[i].algo;
    const double ms = median_ms(
        [&] {
          check(cublasLtMatmul(lt, op, &alpha, w, la, a, lb, &beta, out, lc, out, lc, &algo, workspace,
                               workspace_bytes, nullptr),
                "cublasLtMatmul");
        },
        reps);
    std::printf("  %d  %4d  %4d  %6d  %7d  %5d  %6d  %9d  %7d  %6d  %5.2f  %7.3f  %7.1f\n", i,
                config(algo, CUBLASLT_ALGO_CONFIG_ID), config(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                config(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), config(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                config(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID), config(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                config(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), config(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                config(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), found[i].wavesCount, ms, flops / ms * 1e-9);
  }
  std::printf("  (tile, stages, cluster and inner shape are cublasLt's enum values: cublasLtMatmulTile_t, "
              "cublasLtMatmulStages_t, cublasLtClusterShape_t, cublasLtMatmulInnerShape_t)\n");

  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  const double gemm_ex = median_ms(
      [&] {
        check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &alpha, w, CUDA_R_16BF, k, a, CUDA_R_16BF, k,
                           &beta, out, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
      },
      reps);
  std::printf("cublasGemmEx (the sequential baseline's call): %.3f ms, %.1f TFLOP/s\n", gemm_ex, flops / gemm_ex * 1e-9);

  cublasDestroy(handle);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  COMET_CUDA_CHECK(cudaFree(a));
  COMET_CUDA_CHECK(cudaFree(w));
  COMET_CUDA_CHECK(cudaFree(out));
  COMET_CUDA_CHECK(cudaFree(workspace));
  return 0;
}
