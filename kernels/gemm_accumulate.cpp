#include "kernels/gemm_accumulate.h"

#ifdef DD_HAVE_CUDA
#include <cublas_v2.h>

namespace kernels {

int gemm_rowmajor(void* cublas_handle, void* c, DType c_dtype, int64_t ldc, const void* a, int64_t lda, bool a_trans,
                  const void* b, int64_t ldb, bool b_trans, DType ab_dtype, int64_t M, int64_t N, int64_t K,
                  bool accumulate, bool no_workspace) {
  if (M == 0 || N == 0) return 0;
  // An empty sum: c += 0 leaves c; c = 0 is the caller's to write (refused here).
  if (K == 0) return accumulate ? 0 : static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED);
  if (ab_dtype == DType::F32 || (c_dtype != DType::F32 && c_dtype != ab_dtype))
    return static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED);
  auto handle = static_cast<cublasHandle_t>(cublas_handle);
  if (no_workspace) {
    const cublasStatus_t st = cublasSetWorkspace(handle, nullptr, 0);
    if (st != CUBLAS_STATUS_SUCCESS) return static_cast<int>(st);
  }
  auto type_of = [](DType d) { return d == DType::BF16 ? CUDA_R_16BF : d == DType::F16 ? CUDA_R_16F : CUDA_R_32F; };
  const cudaDataType_t t = type_of(ab_dtype);
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  // cuBLAS is column-major: row-major c [M,N] is column-major cᵀ [N,M] = op(b)ᵀ · op(a)ᵀ. A
  // row-major matrix read column-major is its transpose, so b stored [K,N] is already op(b)ᵀ (no
  // transpose) and b stored [N,K] needs one; likewise a.
  return static_cast<int>(cublasGemmEx(handle, b_trans ? CUBLAS_OP_T : CUBLAS_OP_N, a_trans ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, b, t,
                                       static_cast<int>(ldb), a, t, static_cast<int>(lda), &beta, c, type_of(c_dtype),
                                       static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace kernels
#endif
