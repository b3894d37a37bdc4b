// Row-major GEMMs of bf16/fp16 operands through cuBLAS with the output's dtype and the workspace
// chosen by the caller: c (+)= op(a) · op(b) into fp32 c (a weight gradient summed over chunks or
// micro-batches then never passes through a bf16 product that is cast to fp32 and added: two
// extra passes over the fp32 matrix per chunk), or into a bf16/fp16 c; with or without cuBLAS's
// workspace. Host-side call into cuBLAS (no kernel of ours); raw pointers, no torch.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

#ifdef DD_HAVE_CUDA
// Row-major c [M, N] (+)= op(a) [M, K] · op(b) [K, N] with bf16/fp16 a and b, c of `c_dtype` (a and
// b's dtype, or F32), fp32 accumulation. a is stored [M, K] (or [K, M] when a_trans), b [K, N] (or
// [N, K] when b_trans), each with unit column stride and row stride lda / ldb; c's row stride ldc.
// Without `accumulate` c is overwritten (beta = 0: never read, so it may be uninitialised); K = 0
// without `accumulate` is refused (CUBLAS_STATUS_NOT_SUPPORTED): the caller zeroes c.
// `no_workspace`: the call runs with no cuBLAS workspace (the handle's is restored by LibTorch
// the next time it hands the handle out). cuBLAS then picks kernels that need no zeroed semaphore:
// in a CUDA graph each of those memsets costs a node and the gaps around it.
// `cublas_handle` is a cublasHandle_t already bound to the caller's stream. Returns the
// cublasStatus_t (0 = success).
int gemm_rowmajor(void* cublas_handle, void* c, DType c_dtype, int64_t ldc, const void* a, int64_t lda, bool a_trans,
                  const void* b, int64_t ldb, bool b_trans, DType ab_dtype, int64_t M, int64_t N, int64_t K,
                  bool accumulate, bool no_workspace);
#endif

}  // namespace kernels
