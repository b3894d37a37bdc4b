// Grouped GEMMs for mixture-of-experts layers: rows of x are grouped by expert (group e has m_e
// consecutive rows), every group multiplies its own weight, all groups in one cuBLAS call
// (cublasGemmGroupedBatchedEx) instead of a few launches per expert. Row-major operands:
//   forward   y_e [m_e, N]  = x_e [m_e, K] · w_eᵀ     (w [E, N, K])
//   input     dx_e [m_e, K] = dy_e [m_e, N] · w_e
//   weight    dw_e [N, K]   = dy_e ᵀ · x_e           (groups with m_e = 0 are left untouched)
// bf16, fp16 or fp32 operands, fp32 accumulation. Host-side calls into cuBLAS (no kernel of
// ours); raw pointers, no torch. The reference is model/grouped_linear.h's per-group loop.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace kernels {

enum class GroupedProduct : int { Forward = 0, InputGrad = 1, WeightGrad = 2 };

#ifdef DD_HAVE_CUDA
// rows[e] = m_e for the E groups (host). a, b, c are the operands of the chosen product:
//   Forward:    a = x [M, K],  b = w [E, N, K],  c = y [M, N]
//   InputGrad:  a = dy [M, N], b = w [E, N, K],  c = dx [M, K]
//   WeightGrad: a = dy [M, N], b = x [M, K],     c = dw [E, N, K]
// `pointer_table` is device memory for 3 · E pointers, written by this call (stream-ordered copy
// from `host_table`, host memory for as many, which must stay valid until the copy is done: pass
// pinned memory the caller keeps, or pageable memory and the copy is synchronous).
// `cublas_handle` is bound to `stream`. Returns 0, or a cublasStatus_t / cudaError_t code.
int grouped_gemm(void* cublas_handle, void* stream, GroupedProduct product, DType dt, const std::vector<int64_t>& rows,
                 int64_t N, int64_t K, const void* a, const void* b, void* c, void** host_table, void** pointer_table);
#endif

}  // namespace kernels
