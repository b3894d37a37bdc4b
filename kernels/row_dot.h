// Per-row dot products of two fp32 (or bf16) matrices, out[r] = Σ_i a[r, i] · b[r, i]: the gated delta rule's
// decay gradient, Σ h_in ⊙ dh_next over each chunk's [dk, dv] state (model/gdr_chunk_core.cpp).
// cuBLAS runs this as a batched gemv that reached about half the memory bandwidth; here one block
// reduces one row with 16-byte loads, in a fixed order (deterministic). Raw pointers, no torch;
// the reference is a batched product in model/bmm_fp32.cpp.
#pragma once

#include <cstdint>

namespace kernels {

#ifdef DD_HAVE_CUDA
// a, b: R rows of n floats, row r at a + r · n (contiguous). out [R]. Returns the cudaError_t of
// the launch (0 = success).
int row_dot_fp32(float* out, const float* a, const float* b, int64_t R, int64_t n, void* stream);
// The same with a in bf16 (raw bits, widened exactly): the delta rule's saved states under 16-bit
// training (model/gdr_scan.h).
int row_dot_bf16_fp32(float* out, const uint16_t* a, const float* b, int64_t R, int64_t n, void* stream);
// And with both in bf16: the states against their gradient from the fused reverse scan, which
// writes it in bf16 (kernels::GdrScanArgs::dO).
int row_dot_bf16(float* out, const uint16_t* a, const uint16_t* b, int64_t R, int64_t n, void* stream);
#endif

}  // namespace kernels
