// Per-tensor FP8 quantisation with the current amax, for the fp8 linear layers:
//   scale = amax(|x|) / fmax  (1 when x is all zeros),   q = saturate(x / scale) in e4m3 or e5m2
// in two kernels (the amax reduction, then one pass that writes q and, on request, its transpose
// qᵀ — the operand layout _scaled_mm wants for the backward products) instead of about eight
// ATen passes and three transposing copies. A non-finite amax bumps a device counter (the only
// way a cast scaled by the current amax saturates). Raw pointers, no torch; the reference is
// model/fp8_linear.h's quantize_fp8 (ATen ops), which the kernels match bit for bit.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

#ifdef DD_HAVE_CUDA
// x [rows, cols] row-major (row stride ld ≥ cols) of dtype `dt`. Writes q [rows, cols] contiguous,
// qt [cols, rows] contiguous when qt is not nullptr, the scale (one fp32 on the device) and the
// amax into `amax_scratch` (one fp32 on the device, overwritten). `saturations` (one
// int64 on the device) counts non-finite amaxes. Returns the cudaError_t (0 = success).
int fp8_quantize(void* q, void* qt, float* scale, float* amax_scratch, unsigned long long* saturations,
                 const void* x, DType dt, int64_t rows, int64_t cols, int64_t ld, bool e5m2, void* stream);
#endif

}  // namespace kernels
