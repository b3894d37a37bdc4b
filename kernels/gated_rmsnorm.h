// The Gated DeltaNet's output norm (MODEL.md §4): per row n (one head of one token, D wide),
//   y = ô · w ⊙ silu(z),  ô = o · r,  r = 1/sqrt(mean(o²) + eps)
// and its backward, with s = silu(z), σ = sigmoid(z):
//   g = dy ⊙ s ⊙ w;  do = r · (g − ô · mean(g ⊙ ô));  dz = dy ⊙ ô ⊙ w ⊙ σ (1 + z (1 − σ));  dw = Σ_rows dy ⊙ s ⊙ ô
// One kernel each way instead of the RMSNorm kernel plus ATen's cast, silu, product and their
// backward. o and do are fp32 (the delta rule's output), or bf16 beside bf16 y and z (its output
// under 16-bit training, model/gdr_chunk_core.h; statistics still fp32); z is read in place from the gate
// projection's column slice: row n sits at (n / z_heads) · z_ld + (n % z_heads) · D (z_heads rows per
// token, token stride z_ld); dz is written in z's layout and dtype (so that it can share one buffer
// with the gradients of the columns beside z); y, dy in the output dtype;
// w [D], rstd [N] and all statistics fp32. One warp per row, D ≤ 1024. Raw pointers, no torch; the
// reference is model/fused_gated_norm.h's ATen formula.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

struct GatedNormRows {
  int64_t N = 0, D = 0;
  int64_t z_heads = 1, z_ld = 0;
  // Where row n of o (and of d_o) is: row o_row[n] of a row list in another order (the delta
  // rule's chunk layout, so its output is never copied into token order); nullptr: row n. y, dy,
  // z, dz and rstd stay in token order.
  const int32_t* o_row = nullptr;
};

inline bool gated_rmsnorm_supports(int64_t D) { return D >= 1 && D <= 1024; }

// Whether the kernels take o (and d_o) of o_dt beside y_dt and z_dt: fp32 o with any, bf16 o with
// bf16 y and z.
inline bool gated_rmsnorm_takes_o(DType o_dt, DType y_dt, DType z_dt) {
  return o_dt == DType::F32 || (o_dt == DType::BF16 && y_dt == DType::BF16 && z_dt == DType::BF16);
}

#ifdef DD_HAVE_CUDA
// Each returns the cudaError_t of the launch (0 = success); unsupported sizes and dtypes are
// cudaErrorInvalidValue.
int gated_rmsnorm_forward(void* y, DType y_dt, float* rstd, const void* o, DType o_dt, const void* z, DType z_dt,
                          const float* w, const GatedNormRows& rows, float eps, void* stream);

// Whether rows up to 512 wide take the register kernels (the default) or the looped ones: a
// process-wide switch for `bench train --row-kernels baseline` and the tests.
void gated_rmsnorm_register_rows(bool on);

// Whether the forward and backward for 16-bit o, z and y of one type (the Gated DeltaNet's under
// 16-bit training) take four rows a warp, eight lanes a row, 16-byte pieces (the default, with the
// register rows on; D a multiple of 8 up to 256, rows aligned), or a row a warp (the register
// forward, the staged backward): a process-wide switch for `bench train --row-kernels
// row-a-warp-norm` and the tests.
void gated_rmsnorm_grouped_rows(bool on);
// Launches of the grouped kernels so far in this process, both directions (for the tests).
int64_t gated_rmsnorm_grouped_launches();

// Whether the backward for 16-bit y and z (same dtype) stages its rows through shared memory where
// it takes the register kernels' rows of up to 256 (the default), or keeps them in registers as
// those do: a process-wide switch for `bench train --row-kernels register-norm` and the tests.
void gated_rmsnorm_staged_rows(bool on);
// Launches of the staged backward so far in this process (for the tests).
int64_t gated_rmsnorm_staged_launches();

// Rows of dw's partial sums the backward writes: dw = dw_partial[0:rows].sum(0).
int64_t gated_rmsnorm_backward_partial_rows(int64_t N);

// d_o in o's dtype.
int gated_rmsnorm_backward(void* d_o, void* dz, float* dw_partial, const void* dy, DType y_dt, const void* o,
                           DType o_dt, const void* z, DType z_dt, const float* w, const float* rstd,
                           const GatedNormRows& rows, void* stream);
#endif

}  // namespace kernels
