// Per-tensor FP8 quantisation for the fp8 linear layers, with the current amax:
//   scale = amax(|x|) / fmax  (1 when x is all zeros),   q = saturate(x / scale) in e4m3 or e5m2
// in two kernels (the amax reduction, then one pass that writes q and, on request, its transpose
// qᵀ — the operand layout _scaled_mm wants for the backward products) instead of about eight
// ATen passes and three transposing copies; or with delayed scaling (fp8_quantize_delayed, below)
// in the quantising pass alone. A non-finite amax bumps a device counter (the only
// way a cast scaled by the current amax saturates). Raw pointers, no torch; the reference is
// model/fp8_linear.h's quantize_fp8 (ATen ops), which the kernels match bit for bit.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

// Delayed scaling: the scale comes from the amaxes of the tensor's previous quantisations (at the
// same place in the model, one step earlier), so quantising reads x once instead of twice; the
// amax pass is folded into the quantising kernel, whose last block to finish files the new amax.
// One tensor role's record on the device is kFp8RecordWords 32-bit words:
//   [0, kFp8History)      amaxes of its last kFp8History quantisations, newest first (0 = none yet)
//   [kFp8History]         this quantisation's amax while the kernel runs (fp32 bits; 0 between calls)
//   [kFp8History + 1]     blocks finished (unsigned; 0 between calls)
constexpr int kFp8History = 16;
constexpr int kFp8RecordWords = kFp8History + 2;

// Most parts fp8_quantize_rows_delayed takes.
constexpr int kFp8MaxParts = 8;

#ifdef DD_HAVE_CUDA
// x [rows, cols] row-major (row stride ld ≥ cols) of dtype `dt`. Writes q [rows, cols] contiguous,
// qt [cols, rows] contiguous when qt is not nullptr, the scale (one fp32 on the device) and the
// amax into `amax_scratch` (one fp32 on the device, overwritten). `saturations` (one
// int64 on the device) counts non-finite amaxes. Returns the cudaError_t (0 = success).
int fp8_quantize(void* q, void* qt, float* scale, float* amax_scratch, unsigned long long* saturations,
                 const void* x, DType dt, int64_t rows, int64_t cols, int64_t ld, bool e5m2, void* stream);

// As fp8_quantize, with delayed scaling on `record` (see kFp8RecordWords):
//   scale = max(history) · scale_per_amax  (1 when the history is all zero)
// where scale_per_amax = margin / fmax as an fp32 (margin ≥ 1 leaves head room for an amax that
// grows between steps). With `from_current` (a role's first quantisation: no history yet) the scale
// is fp8_quantize's, from this x's amax. Either way x's amax then enters the history (the oldest
// leaves). `saturations` counts a quantisation whose amax is not finite (not filed: the history
// stays finite) or that clipped values (amax / scale > fmax).
int fp8_quantize_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                         const void* x, DType dt, int64_t rows, int64_t cols, int64_t ld, bool e5m2,
                         float scale_per_amax, bool from_current, void* stream);

// fp8_quantize_delayed of the row-wise concatenation of `n_parts` (1..kFp8MaxParts) contiguous
// tensors [part_rows[i], cols] of dtype `dt`, read where they are: the weights of projections that
// share one product (q|k|v, gate|up) quantised without concatenating them first. q [Σ rows, cols],
// qt [cols, Σ rows]. `parts` and `part_rows` are host arrays.
int fp8_quantize_rows_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                              const void* const* parts, const int64_t* part_rows, int n_parts, DType dt, int64_t cols,
                              bool e5m2, float scale_per_amax, bool from_current, void* stream);

// fp8_quantize_delayed of the column-wise concatenation of `n_parts` (1..kFp8MaxParts) tensors
// [rows, part_cols[i]] with row strides part_ld[i] (unit column stride), read where they are: the
// gradients of q, k and v quantised as the gradient of their one product without concatenating
// them first. q [rows, Σ cols], qt [Σ cols, rows]. Host arrays.
int fp8_quantize_cols_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                              const void* const* parts, const int64_t* part_cols, const int64_t* part_ld, int n_parts,
                              DType dt, int64_t rows, bool e5m2, float scale_per_amax, bool from_current,
                              void* stream);

// fp8_quantize_delayed of SwiGLU's activation h = silu(g) · u [rows, F], computed from gu [rows, ld]
// (g in columns [0, F), u in [F, 2F); kernels/swiglu.h's math) as it is quantised, so h is never
// written: q [rows, F], qt [F, rows].
int fp8_quantize_swiglu_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                                const void* gu, DType dt, int64_t rows, int64_t F, int64_t ld, bool e5m2,
                                float scale_per_amax, bool from_current, void* stream);

// fp8_quantize_delayed of SwiGLU's gradient [dg | du] [rows, 2F] (the layout swiglu_backward writes),
// computed from gu [rows, ld] and dh [rows, F] (contiguous) as it is quantised: q [rows, 2F],
// qt [2F, rows], one scale and one amax over both halves.
int fp8_quantize_swiglu_grad_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                                     const void* gu, const void* dh, DType dt, int64_t rows, int64_t F, int64_t ld,
                                     bool e5m2, float scale_per_amax, bool from_current, void* stream);
#endif

}  // namespace kernels
