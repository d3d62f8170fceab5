#include "baselines/fp8_expert_gemm.hpp"

#include <algorithm>
#include <cstdint>

#include "baselines/cublas_check.hpp"
#include "comet/cuda_check.hpp"
#include "comet/fp8.hpp"

namespace comet::baselines {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper
constexpr int kSlackBlocks = 256;

int round_up4(int v) { return (v + 3) / 4 * 4; }

// The largest power of two (at most 256) dividing the address: what cuBLASLt's heuristic may assume.
int alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % uintptr_t(align) != 0) align /= 2;
  return align;
}

int log2_of(int pow2) {
  int l = 0;
  while ((1 << l) < pow2) ++l;
  return l;
}

template <class T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  COMET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

template <class T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
  COMET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Fp8ExpertGemm::Fp8ExpertGemm(int max_rows, int n, int k) : max_rows_(max_rows), n_(n), k_(k) {
  COMET_REQUIRE(max_rows >= 0, "Fp8ExpertGemm: max_rows must be >= 0, got ", max_rows);
  COMET_REQUIRE(n > 0 && n % 16 == 0, "Fp8ExpertGemm: n must be a positive multiple of 16, got ", n);
  COMET_REQUIRE(k > 0 && k % fp8::kBlock == 0, "Fp8ExpertGemm: k must be a positive multiple of 128, got ", k);
  int device = 0, major = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major != 9)
    throw CudaError(detail::concat("Fp8ExpertGemm: cuBLASLt's 1 x 128 / 128 x 128 block-scaled fp8 needs an sm_90 "
                                   "device, this one is sm_", major, "x"));

  COMET_CUBLAS_CHECK(cublasLtCreate(&handle_));
  COMET_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attr(desc_, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_attr(desc_, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_attr(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
  set_attr(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
  // Weights: stored k x n column-major (row-major [n][k]), used transposed.
  COMET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout_, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), int64_t(k)));
  COMET_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_));
  set_pref(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kWorkspaceBytes));

  COMET_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
  // max_rows plus the pad rows of up to kSlackBlocks blocks (3 each), so that the usual routing never grows it.
  const int rows = round_up4(std::max(max_rows, 1)) + 3 * kSlackBlocks;
  codes_bytes_ = size_t(rows) * k;
  scales_bytes_ = size_t(rows) * (k / fp8::kBlock) * sizeof(float);
  COMET_CUDA_CHECK(cudaMalloc(&codes_, codes_bytes_));
  COMET_CUDA_CHECK(cudaMalloc(&scales_, scales_bytes_));
  COMET_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

Fp8ExpertGemm::~Fp8ExpertGemm() {
  if (done_) {
    cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
  }
  for (auto& [key, plan] : plans_) {
    if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.d) cublasLtMatrixLayoutDestroy(plan.d);
  }
  if (pref_) cublasLtMatmulPreferenceDestroy(pref_);
  if (a_layout_) cublasLtMatrixLayoutDestroy(a_layout_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
  if (handle_) cublasLtDestroy(handle_);
  for (void* p : {workspace_, codes_, scales_, out_, weight_scales_})
    if (p) cudaFree(p);
}

void Fp8ExpertGemm::reserve(void** buf, size_t* capacity, size_t bytes, cudaStream_t stream) {
  if (bytes <= *capacity) return;
  // The old buffer may still be read or written by work enqueued earlier: wait for it before freeing.
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  COMET_CUDA_CHECK(cudaEventSynchronize(done_));
  const size_t grown = std::max(bytes, *capacity + *capacity / 2);
  if (*buf) COMET_CUDA_CHECK(cudaFree(*buf));
  *buf = nullptr;
  *capacity = 0;
  COMET_CUDA_CHECK(cudaMalloc(buf, grown));
  *capacity = grown;
}

const Fp8ExpertGemm::Plan& Fp8ExpertGemm::plan_for(int rows_pad, int align_a, int align_b, int align_d) {
  const uint64_t key = uint64_t(uint32_t(rows_pad)) << 16 | uint64_t(log2_of(align_a)) << 8 |
                       uint64_t(log2_of(align_b)) << 4 | uint64_t(log2_of(align_d));
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan plan;
  // Rows: stored k x rows_pad column-major (row-major [rows_pad][k]); D: n x rows_pad column-major.
  COMET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_8F_E4M3, uint64_t(k_), uint64_t(rows_pad), int64_t(k_)));
  COMET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, CUDA_R_16BF, uint64_t(n_), uint64_t(rows_pad), int64_t(n_)));
  set_pref(pref_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(align_a));
  set_pref(pref_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t(align_b));
  set_pref(pref_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t(align_d));
  set_pref(pref_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t(align_d));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_layout_, plan.b, plan.d, plan.d,
                                                                pref_, 1, &result, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.d);
    throw CudaError(detail::concat("Fp8ExpertGemm: cuBLASLt has no block-scaled fp8 algorithm for m = ", n_,
                                   ", n = ", rows_pad, ", k = ", k_, " (alignments A ", align_a, ", B ", align_b,
                                   ", D ", align_d, " bytes): ",
                                   status != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(status) : "none found"));
  }
  plan.algo = result.algo;
  plan.workspace = result.workspaceSize;
  return plans_.emplace(key, plan).first->second;
}

void Fp8ExpertGemm::run(const void* a_records, const void* b_codes, const float* b_scales, void* c_bf16,
                        const std::vector<RowBlock>& blocks, cudaStream_t stream) {
  COMET_REQUIRE(aligned16(a_records) && aligned16(b_codes) && aligned16(b_scales) && aligned16(c_bf16),
                "Fp8ExpertGemm::run: a_records, b_codes, b_scales and c must be 16-byte aligned");
  const int blocks_k = k_ / fp8::kBlock, blocks_k4 = round_up4(blocks_k), blocks_n = (n_ + fp8::kBlock - 1) / fp8::kBlock;
  std::vector<Fp8UnpackBlock> unpack;
  std::vector<size_t> which;  // index in `blocks` of each unpack entry
  long long total_rows = 0;
  int pad_rows = 0, max_expert = -1, max_odd_pad = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const RowBlock& b = blocks[i];
    COMET_REQUIRE(b.expert >= 0 && b.row >= 0 && b.rows >= 0, "Fp8ExpertGemm::run: bad block ", i, " (expert ",
                  b.expert, ", row ", b.row, ", rows ", b.rows, ")");
    if (b.rows == 0) continue;
    total_rows += b.rows;
    Fp8UnpackBlock u;
    u.src_row = b.row;
    u.rows = b.rows;
    u.rows_pad = round_up4(b.rows);
    u.dst_row = pad_rows;
    pad_rows += u.rows_pad;
    if (u.rows_pad != u.rows) max_odd_pad = std::max(max_odd_pad, u.rows_pad);
    max_expert = std::max(max_expert, b.expert);
    unpack.push_back(u);
    which.push_back(i);
  }
  COMET_REQUIRE(total_rows <= max_rows_, "Fp8ExpertGemm::run: the blocks hold ", total_rows,
                " rows, more than max_rows = ", max_rows_);
  if (unpack.empty()) return;

  reserve(&codes_, &codes_bytes_, size_t(pad_rows) * k_, stream);
  reserve(&scales_, &scales_bytes_, size_t(pad_rows) * blocks_k * sizeof(float), stream);
  if (max_odd_pad > 0) reserve(&out_, &out_bytes_, size_t(max_odd_pad) * n_ * 2, stream);
  const float* weight_scales = b_scales;
  if (blocks_k4 != blocks_k) {  // cuBLASLt wants the k blocks of a weight row block at a stride of 4
    const int experts = max_expert + 1;
    reserve(&weight_scales_, &weight_scales_bytes_, size_t(experts) * blocks_n * blocks_k4 * sizeof(float), stream);
    pad_fp8_weight_scales(b_scales, experts, blocks_n, blocks_k, static_cast<float*>(weight_scales_), stream);
    weight_scales = static_cast<const float*>(weight_scales_);
  }
  unpack_fp8_records(a_records, k_, unpack, codes_, static_cast<float*>(scales_), stream);

  const float alpha = 1.0f, beta = 0.0f;
  const size_t weight_bytes = size_t(n_) * k_, weight_scale_count = size_t(blocks_n) * blocks_k4;
  for (size_t u = 0; u < unpack.size(); ++u) {
    const Fp8UnpackBlock& ub = unpack[u];
    const RowBlock& b = blocks[which[u]];
    const void* a = static_cast<const char*>(b_codes) + size_t(b.expert) * weight_bytes;
    const float* a_scale = weight_scales + size_t(b.expert) * weight_scale_count;
    const void* rows = static_cast<const char*>(codes_) + size_t(ub.dst_row) * k_;
    const float* rows_scale = static_cast<const float*>(scales_) + size_t(ub.dst_row) * blocks_k;
    const bool direct = ub.rows_pad == ub.rows;
    void* c_rows = static_cast<char*>(c_bf16) + size_t(b.row) * n_ * 2;
    void* d = direct ? c_rows : out_;
    // The scale pointers first: the heuristic query checks them too.
    set_attr(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(a_scale));
    set_attr(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(rows_scale));
    const Plan& plan = plan_for(ub.rows_pad, alignment_of(a), alignment_of(rows), alignment_of(d));
    COMET_CUBLAS_CHECK(cublasLtMatmul(handle_, desc_, &alpha, a, a_layout_, rows, plan.b, &beta, d, plan.d, d, plan.d,
                                      &plan.algo, workspace_, plan.workspace, stream));
    if (!direct)
      COMET_CUDA_CHECK(cudaMemcpyAsync(c_rows, out_, size_t(ub.rows) * n_ * 2, cudaMemcpyDeviceToDevice, stream));
  }
  COMET_CUDA_CHECK(cudaEventRecord(done_, stream));
}

}  // namespace comet::baselines
