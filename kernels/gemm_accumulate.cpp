#include "kernels/gemm_accumulate.h"

#ifdef DD_HAVE_CUDA
#include <cublas_v2.h>

namespace kernels {

int gemm_at_b_accumulate_f32(void* cublas_handle, float* c, int64_t ldc, const void* a, int64_t lda, const void* b,
                             int64_t ldb, DType ab_dtype, int64_t K, int64_t M, int64_t N) {
  return gemm_at_b_f32(cublas_handle, c, ldc, a, lda, b, ldb, ab_dtype, K, M, N, /*accumulate=*/true);
}

int gemm_at_b_f32(void* cublas_handle, float* c, int64_t ldc, const void* a, int64_t lda, const void* b, int64_t ldb,
                  DType ab_dtype, int64_t K, int64_t M, int64_t N, bool accumulate) {
  if (M == 0 || N == 0) return 0;
  // An empty sum: c += 0 leaves c; c = 0 is the caller's to write (refused here).
  if (K == 0) return accumulate ? 0 : static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED);
  if (ab_dtype == DType::F32) return static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED);
  const cudaDataType_t t = ab_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  // cuBLAS is column-major: row-major c [M,N] is column-major cᵀ [N,M] = bᵀ · a, where row-major
  // b [K,N] reads as column-major bᵀ [N,K] (no transpose) and row-major a [K,M] as column-major
  // aᵀ [M,K] (transposed back).
  return static_cast<int>(cublasGemmEx(static_cast<cublasHandle_t>(cublas_handle), CUBLAS_OP_N, CUBLAS_OP_T,
                                       static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, b, t,
                                       static_cast<int>(ldb), a, t, static_cast<int>(lda), &beta, c, CUDA_R_32F,
                                       static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace kernels
#endif
