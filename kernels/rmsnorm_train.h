// RMSNorm for training, with the residual add of a pre-norm block fused in front of it:
//   h = x + b (b optional),  y = h · r · w,  r = 1/sqrt(mean(h²) + eps)
// and its backward. Raw pointers, no torch; rows are contiguous (stride C) except a strided input x.
//   dh_total = dh + r · (g − ĥ · mean(g · ĥ)),  g = dy · w,  ĥ = h · r;   dw = Σ_rows dy · ĥ
//   dx = dh_total (x's dtype),  db = dh_total (b's dtype)
// x, h, dh, dx are in the residual stream's dtype `x_dt`; y, dy in the output dtype `y_dt`; b, db in
// the branch's dtype `b_dt` (under autocast: fp32 residual stream, bf16 output for the matmuls that
// follow, bf16 or fp32 branch). w, rstd and all statistics are fp32. The reference is
// model/fused_rmsnorm.h's ATen formula.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

#ifdef DD_HAVE_CUDA
// Whether the kernels take this combination of dtypes (fp32 residual stream with any output and
// branch dtype, or x, y and b all of one dtype) and width (C <= 16384). Host function; any thread.
bool add_rmsnorm_supported(DType x_dt, DType y_dt, DType b_dt, int64_t C);

// Whether the kernels move 4 adjacent columns per load and store where the row allows it (the
// default), or one: a process-wide switch for `bench train --row-kernels baseline` and the tests.
void add_rmsnorm_vector_loads(bool on);

// b may be nullptr (no add: h is x and is not written). w may be nullptr (weight-free). x_ld: the
// elements between x's rows, C where 0; with no add, x may be a column slice of wider rows
// (x_ld > C: no copy of it needed). Returns the cudaError_t of the launch (0 = success); an
// unsupported combination is refused (cudaErrorInvalidValue).
int add_rmsnorm_forward(void* y, DType y_dt, void* h, float* rstd, const void* x, DType x_dt, const void* b,
                        DType b_dt, const float* w, int64_t N, int64_t C, float eps, void* stream, int64_t x_ld = 0);

// Whether narrow 16-bit rows without an add (C a multiple of 8 up to 512: MLA's latent norms) take
// the four-rows-a-warp kernels of kernels/rmsnorm_narrow.cu (the default), or the block kernels: a
// process-wide switch for `bench train --row-kernels block-narrow-norm` and the tests. Set it
// between steps, not between a forward and its backward. The launches counted are the narrow
// kernels' (forward and backward), for the tests.
void add_rmsnorm_narrow_rows(bool on);
int64_t add_rmsnorm_narrow_launches();

// Rows of dw's partial sums the backward writes for N rows of C (the dtypes and whether the forward
// had an add pick the kernel): dw = dw_partial[0:rows].sum(0). Pass it to add_rmsnorm_backward.
int rmsnorm_backward_partial_rows(int64_t N, int64_t C, DType x_dt, DType y_dt, bool has_b);

// h: the normalised input (x when there was no add), rows h_ld elements apart (C where 0). dh (grad
// of h from its other uses) and db may be nullptr; dw_partial [partial_rows, C] fp32, unused when
// w is nullptr; partial_rows: rmsnorm_backward_partial_rows(...) (any count ≥ 1 is correct; the
// narrow kernels run only at theirs).
int add_rmsnorm_backward(void* dx, void* db, float* dw_partial, const void* dy, const void* dh, const void* h,
                         DType x_dt, DType y_dt, DType b_dt, const float* w, const float* rstd, int64_t N, int64_t C,
                         int partial_rows, void* stream, int64_t h_ld = 0);
#endif

}  // namespace kernels
