// Zeroes the rows of an fp32 (or 16-bit) matrix that no entry of a row map names: the Gated DeltaNet output's
// chunk-padding rows, whose gradient must be exactly 0 while every other row is written by the
// output norm's backward. A zero fill of the whole [M, D] gradient first cost 31 µs a layer at
// moe-1b's shape ([100992, 256], 2.7% of it padding); this writes the padding rows only. Raw
// pointers, no torch; the reference is the zero fill.
#pragma once

#include <cstdint>

namespace kernels {

#ifdef DD_HAVE_CUDA
// x [M, D] fp32, rows contiguous (row stride D); row_of [n] int32, each in [0, M) (not checked: that
// needs a host sync). named: M bytes of scratch. Rows named by no entry become 0; the others are not
// touched. One memset and two launches. Returns the cudaError_t of the launches (0 = success).
int zero_unnamed_rows_f32(float* x, int64_t M, int64_t D, const int32_t* row_of, int64_t n, uint8_t* named,
                          void* stream);
// The same for rows of 16-bit elements (bf16 or fp16: zero is the same bits).
int zero_unnamed_rows_16bit(void* x, int64_t M, int64_t D, const int32_t* row_of, int64_t n, uint8_t* named,
                            void* stream);
// The same when the caller has the unnamed rows as a list: rows [n] int32, each a row of x (not
// checked), zeroed; no other row is touched. One launch, a warp a listed row (a fixed chunk
// layout's padding rows, model/gdr_plan_slots.h, where marking the named rows first took two
// launches and a pass over every row's mark in each layer).
int zero_listed_rows_f32(float* x, int64_t D, const int32_t* rows, int64_t n, void* stream);
int zero_listed_rows_16bit(void* x, int64_t D, const int32_t* rows, int64_t n, void* stream);
#endif

}  // namespace kernels
