// What the FP8 quantising kernel (kernels/fp8_quant.cu) reads: a plain tensor, blocks of one
// operand read where they are (rows: q|k|v's or gate|up's weights; columns: q|k|v's gradients), or
// SwiGLU's activation or gradient computed from their inputs on the way in. Device code only.
#pragma once

#include <cstdint>

#include "kernels/elem.cuh"
#include "kernels/fp8_quant.h"
#include "kernels/swiglu_math.cuh"

namespace kernels {
namespace fp8_sources {

constexpr int kVec = 8;  // elements per load

// Sources. Each gives, at (row r, column c) of its [rows, cols] index space, kOut values; value o
// lands in q's column o·cols + c (q is [rows, kOut·cols]). load() takes kVec columns from c (the
// caller checked vector alignment), at() one.
template <typename T>
struct PlainSource {
  static constexpr int kOut = 1;
  const T* x;
  int64_t ld;
  __device__ __forceinline__ void load(int64_t r, int64_t c, float (&v)[kOut][kVec]) const {
    Vec<T, kVec> a;
    a.load(x + r * ld + c);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[0][e] = a.get(e);
  }
  __device__ __forceinline__ void at(int64_t r, int64_t c, float (&v)[kOut]) const { v[0] = to_f32(x[r * ld + c]); }
};

// The row-wise concatenation of up to kFp8MaxParts contiguous [rows_i, cols] tensors, read where
// they are (row r is in the first part whose end exceeds it).
template <typename T>
struct RowsSource {
  static constexpr int kOut = 1;
  const T* part[kFp8MaxParts];
  int64_t end[kFp8MaxParts];  // cumulative rows
  int n;
  int64_t cols;
  __device__ __forceinline__ const T* row(int64_t r) const {
    int i = 0;
    while (i + 1 < n && r >= end[i]) ++i;
    return part[i] + (r - (i > 0 ? end[i - 1] : 0)) * cols;
  }
  __device__ __forceinline__ void load(int64_t r, int64_t c, float (&v)[kOut][kVec]) const {
    Vec<T, kVec> a;
    a.load(row(r) + c);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[0][e] = a.get(e);
  }
  __device__ __forceinline__ void at(int64_t r, int64_t c, float (&v)[kOut]) const { v[0] = to_f32(row(r)[c]); }
};

// The column-wise concatenation of up to kFp8MaxParts tensors [rows, cols_i] (row stride ld_i, unit
// column stride), read where they are (column c is in the first part whose end exceeds it).
template <typename T>
struct ColsSource {
  static constexpr int kOut = 1;
  const T* part[kFp8MaxParts];
  int64_t ld[kFp8MaxParts];
  int64_t end[kFp8MaxParts];  // cumulative columns
  int n;
  __device__ __forceinline__ const T* at_ptr(int64_t r, int64_t c) const {
    int i = 0;
    while (i + 1 < n && c >= end[i]) ++i;
    return part[i] + r * ld[i] + (c - (i > 0 ? end[i - 1] : 0));
  }
  __device__ __forceinline__ void load(int64_t r, int64_t c, float (&v)[kOut][kVec]) const {
    Vec<T, kVec> a;
    a.load(at_ptr(r, c));
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[0][e] = a.get(e);
  }
  __device__ __forceinline__ void at(int64_t r, int64_t c, float (&v)[kOut]) const { v[0] = to_f32(*at_ptr(r, c)); }
};

// h = silu(g) · u from gu [rows, ld]: g in columns [0, cols), u in [cols, 2·cols).
template <typename T>
struct SwigluSource {
  static constexpr int kOut = 1;
  const T* gu;
  int64_t ld, F;
  __device__ __forceinline__ void load(int64_t r, int64_t c, float (&v)[kOut][kVec]) const {
    Vec<T, kVec> g, u;
    g.load(gu + r * ld + c);
    u.load(gu + r * ld + F + c);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[0][e] = swiglu_value(g.get(e), u.get(e));
  }
  __device__ __forceinline__ void at(int64_t r, int64_t c, float (&v)[kOut]) const {
    v[0] = swiglu_value(to_f32(gu[r * ld + c]), to_f32(gu[r * ld + F + c]));
  }
};

// [dg | du] from gu [rows, ld] and dh [rows, F] (contiguous): both halves of SwiGLU's gradient for
// one (r, c), so g, u and dh are read once.
template <typename T>
struct SwigluGradSource {
  static constexpr int kOut = 2;
  const T* gu;
  const T* dh;
  int64_t ld, F;
  __device__ __forceinline__ void load(int64_t r, int64_t c, float (&v)[kOut][kVec]) const {
    Vec<T, kVec> g, u, d;
    g.load(gu + r * ld + c);
    u.load(gu + r * ld + F + c);
    d.load(dh + r * F + c);
#pragma unroll
    for (int e = 0; e < kVec; ++e) swiglu_grads(g.get(e), u.get(e), d.get(e), v[0][e], v[1][e]);
  }
  __device__ __forceinline__ void at(int64_t r, int64_t c, float (&v)[kOut]) const {
    swiglu_grads(to_f32(gu[r * ld + c]), to_f32(gu[r * ld + F + c]), to_f32(dh[r * F + c]), v[0], v[1]);
  }
};

}  // namespace fp8_sources
}  // namespace kernels
