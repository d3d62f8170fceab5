#include "baselines/expert_gemm.hpp"

#include <string>

#include "baselines/cublas_check.hpp"
#include "comet/cuda_check.hpp"

namespace comet {

const char* to_string(GemmPath path) {
  switch (path) {
    case GemmPath::grouped: return "grouped";
    case GemmPath::loop: return "loop";
  }
  return "?";
}

GemmPath parse_gemm_path(const std::string& s) {
  if (s == "grouped") return GemmPath::grouped;
  if (s == "loop") return GemmPath::loop;
  throw InvalidArgument(detail::concat("unknown GEMM path '", s, "' (expected grouped or loop)"));
}

}  // namespace comet

namespace comet::baselines {

GemmProblems::GemmProblems(int max_problems) : max_problems_(max_problems) {
  COMET_REQUIRE(max_problems >= 1, "GemmProblems: max_problems must be >= 1");
  const size_t bytes = size_t(3) * max_problems * sizeof(void*);
  COMET_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&staging_), bytes));
  COMET_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), bytes));
  COMET_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
}

GemmProblems::~GemmProblems() {
  if (uploaded_) {
    cudaEventSynchronize(uploaded_);
    cudaEventDestroy(uploaded_);
  }
  if (device_) cudaFree(device_);
  if (staging_) cudaFreeHost(staging_);
}

void GemmProblems::assign(const GemmOperands& op, const std::vector<RowBlock>& blocks, cudaStream_t stream) {
  COMET_CUDA_CHECK(cudaEventSynchronize(uploaded_));  // the staging may still feed the previous copy
  op_ = op;
  m_.clear(), rows_.clear(), k_.clear(), lda_.clear(), ldb_.clear(), ldc_.clear(), group_size_.clear();
  trans_a_.clear(), trans_b_.clear(), alpha_.clear(), beta_.clear();
  weight_ptr_.clear(), row_ptr_.clear(), out_ptr_.clear();
  const size_t row_in = size_t(op.k) * 2, row_out = size_t(op.n) * 2, weight = size_t(op.n) * op.k * 2;
  const bool by_k = op.weight == WeightLayout::n_by_k;
  for (const RowBlock& b : blocks) {
    if (b.rows <= 0) continue;  // cuBLAS accepts empty problems, but a launch for nothing still costs
    COMET_REQUIRE(int(rows_.size()) < max_problems_, "GemmProblems: more than ", max_problems_, " problems");
    m_.push_back(op.n);
    rows_.push_back(b.rows);
    k_.push_back(op.k);
    lda_.push_back(by_k ? op.k : op.n);
    ldb_.push_back(op.k);
    ldc_.push_back(op.n);
    group_size_.push_back(1);
    trans_a_.push_back(by_k ? CUBLAS_OP_T : CUBLAS_OP_N);
    trans_b_.push_back(CUBLAS_OP_N);
    alpha_.push_back(1.0f);
    beta_.push_back(0.0f);
    weight_ptr_.push_back(static_cast<const char*>(op.b) + size_t(b.expert) * weight);
    row_ptr_.push_back(static_cast<const char*>(op.a) + size_t(b.row) * row_in);
    out_ptr_.push_back(static_cast<char*>(op.c) + size_t(b.row) * row_out);
  }
  const int n = count();
  if (n == 0) return;
  for (int i = 0; i < n; ++i) {
    staging_[i] = const_cast<void*>(weight_ptr_[i]);
    staging_[max_problems_ + i] = const_cast<void*>(row_ptr_[i]);
    staging_[2 * max_problems_ + i] = out_ptr_[i];
  }
  COMET_CUDA_CHECK(cudaMemcpyAsync(device_, staging_, size_t(3) * max_problems_ * sizeof(void*),
                                   cudaMemcpyHostToDevice, stream));
  COMET_CUDA_CHECK(cudaEventRecord(uploaded_, stream));
}

void GemmProblems::run(cublasHandle_t handle, GemmPath path) const {
  const int n = count();
  if (n == 0) return;
  if (path == GemmPath::grouped) {
    COMET_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        handle, trans_a_.data(), trans_b_.data(), m_.data(), rows_.data(), k_.data(), alpha_.data(),
        const_cast<const void* const*>(device_), CUDA_R_16BF, lda_.data(),
        const_cast<const void* const*>(device_ + max_problems_), CUDA_R_16BF, ldb_.data(), beta_.data(),
        device_ + 2 * max_problems_, CUDA_R_16BF, ldc_.data(), n, group_size_.data(), CUBLAS_COMPUTE_32F));
    return;
  }
  for (int i = 0; i < n; ++i) {
    COMET_CUBLAS_CHECK(cublasGemmEx(handle, trans_a_[i], trans_b_[i], m_[i], rows_[i], k_[i], &alpha_[i],
                                    weight_ptr_[i], CUDA_R_16BF, lda_[i], row_ptr_[i], CUDA_R_16BF, ldb_[i],
                                    &beta_[i], out_ptr_[i], CUDA_R_16BF, ldc_[i], CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
  }
}

long long GemmProblems::total_rows() const {
  long long r = 0;
  for (int v : rows_) r += v;
  return r;
}

void run_weight_grads(cublasHandle_t handle, cudaStream_t stream, const WeightGradOperands& op,
                      const std::vector<RowBlock>& blocks, bool accumulate) {
  const bool f32 = op.type == GradType::f32;
  const size_t elem = f32 ? 4 : 2;
  const size_t per_expert = size_t(op.p_cols) * op.q_cols * elem;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  for (const RowBlock& b : blocks) {
    void* dw = static_cast<char*>(op.dw) + size_t(b.expert) * per_expert;
    if (b.rows <= 0) {
      if (!accumulate) COMET_CUDA_CHECK(cudaMemsetAsync(dw, 0, per_expert, stream));
      continue;
    }
    const void* p = static_cast<const char*>(op.p) + size_t(b.row) * op.p_cols * 2;
    const void* q = static_cast<const char*>(op.q) + size_t(b.row) * op.q_cols * 2;
    COMET_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, op.q_cols, op.p_cols, b.rows, &alpha, q,
                                    CUDA_R_16BF, op.q_cols, p, CUDA_R_16BF, op.p_cols, &beta, dw,
                                    f32 ? CUDA_R_32F : CUDA_R_16BF, op.q_cols, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
  }
}

CublasHandle::CublasHandle(cudaStream_t stream) {
  COMET_CUBLAS_CHECK(cublasCreate(&handle_));
  COMET_CUBLAS_CHECK(cublasSetStream(handle_, stream));
}

CublasHandle::~CublasHandle() {
  if (handle_) cublasDestroy(handle_);
}

}  // namespace comet::baselines
