// cuBLAS is column-major; a row-major matrix M [r, c] is the column-major Mᵀ [c, r] with leading
// dimension c. So each product is computed transposed:
//   Forward     yᵀ [N, m]  = w [N, K] · xᵀ [K, m]        op(A) = T on wᵀ,  op(B) = N on xᵀ
//   InputGrad   dxᵀ [K, m] = wᵀ [K, N] · dyᵀ [N, m]      op(A) = N,        op(B) = N
//   WeightGrad  dwᵀ [K, N] = xᵀ [K, m] · dy [m, N]       op(A) = N,        op(B) = T on dyᵀ
// One group per expert with rows (group_size 1); experts without rows are dropped from the call.
#include "kernels/grouped_gemm.h"

#ifdef DD_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace kernels {

int grouped_gemm(void* cublas_handle, void* stream, GroupedProduct product, DType dt, const std::vector<int64_t>& rows,
                 int64_t N, int64_t K, const void* a, const void* b, void* c, void** host_table, void** pointer_table) {
  const cudaDataType_t t = dt == DType::BF16 ? CUDA_R_16BF : dt == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
  const int64_t esize = dt == DType::F32 ? 4 : 2;
  const auto* pa = static_cast<const char*>(a);
  const auto* pb = static_cast<const char*>(b);
  auto* pc = static_cast<char*>(c);
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, size;
  std::vector<float> alpha, beta;
  const int64_t E = static_cast<int64_t>(rows.size());
  int G = 0;
  int64_t row0 = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t me = rows[static_cast<size_t>(e)];
    if (me > 0) {
      const void *A = nullptr, *B = nullptr;
      void* C = nullptr;
      switch (product) {
        case GroupedProduct::Forward:  // A = w_e, B = x rows, C = y rows
          A = pb + e * N * K * esize, B = pa + row0 * K * esize, C = pc + row0 * N * esize;
          ta.push_back(CUBLAS_OP_T), tb.push_back(CUBLAS_OP_N);
          m.push_back(static_cast<int>(N)), n.push_back(static_cast<int>(me)), k.push_back(static_cast<int>(K));
          lda.push_back(static_cast<int>(K)), ldb.push_back(static_cast<int>(K)), ldc.push_back(static_cast<int>(N));
          break;
        case GroupedProduct::InputGrad:  // A = w_e, B = dy rows, C = dx rows
          A = pb + e * N * K * esize, B = pa + row0 * N * esize, C = pc + row0 * K * esize;
          ta.push_back(CUBLAS_OP_N), tb.push_back(CUBLAS_OP_N);
          m.push_back(static_cast<int>(K)), n.push_back(static_cast<int>(me)), k.push_back(static_cast<int>(N));
          lda.push_back(static_cast<int>(K)), ldb.push_back(static_cast<int>(N)), ldc.push_back(static_cast<int>(K));
          break;
        case GroupedProduct::WeightGrad:  // A = x rows, B = dy rows, C = dw_e
          A = pb + row0 * K * esize, B = pa + row0 * N * esize, C = pc + e * N * K * esize;
          ta.push_back(CUBLAS_OP_N), tb.push_back(CUBLAS_OP_T);
          m.push_back(static_cast<int>(K)), n.push_back(static_cast<int>(N)), k.push_back(static_cast<int>(me));
          lda.push_back(static_cast<int>(K)), ldb.push_back(static_cast<int>(N)), ldc.push_back(static_cast<int>(K));
          break;
      }
      host_table[G] = const_cast<void*>(A);
      host_table[E + G] = const_cast<void*>(B);
      host_table[2 * E + G] = C;
      size.push_back(1);
      alpha.push_back(1.f);
      beta.push_back(0.f);
      ++G;
    }
    row0 += me;
  }
  if (G == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  // The three pointer arrays live at table, table + E, table + 2E (only the first G of each used).
  cudaError_t ce = cudaMemcpyAsync(pointer_table, host_table, static_cast<size_t>(3 * E) * sizeof(void*),
                                   cudaMemcpyHostToDevice, st);
  if (ce != cudaSuccess) return static_cast<int>(ce);
  auto h = static_cast<cublasHandle_t>(cublas_handle);
  cublasPointerMode_t mode;
  cublasGetPointerMode(h, &mode);
  cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST);
  const cublasStatus_t s = cublasGemmGroupedBatchedEx(
      h, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
      const_cast<const void* const*>(pointer_table), t, lda.data(), const_cast<const void* const*>(pointer_table + E), t,
      ldb.data(), beta.data(), pointer_table + 2 * E, t, ldc.data(), G, size.data(), CUBLAS_COMPUTE_32F);
  cublasSetPointerMode(h, mode);
  return static_cast<int>(s);
}

}  // namespace kernels
#endif
