// RoPE in the rotate-half layout, forward and backward, on q or k of shape [B,T,H,D]:
//   out[..., j] = x1 cos θ − x2 sin θ,  out[..., j + D/2] = x2 cos θ + x1 sin θ
// with x1 = x[..., j], x2 = x[..., j + D/2], θ = table angle of (position of the token, j). The
// backward is the same rotation by −θ (`inverse`). Raw pointers, no torch. x may be a strided view
// (e.g. q inside a fused qkv projection): its last dim is unit-stride, B, T, H have element strides.
// out is contiguous [B,T,H,D]. Tables are the fp64 cos/sin [max_pos, D/2]; math in fp32.
// The reference is model/layers.h's apply_rope (ATen ops).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

struct RopeShape {
  int64_t B, T, H, D;
  int64_t x_sb, x_st, x_sh;  // element strides of x over B, T, H
  int64_t pos_sb, pos_st;    // element strides of the int64 positions [B,T] (0 for a broadcast row)
};

// Up to six parts of each token's row for one launch of rope_apply_parts (a fused q|k|v
// projection's q and k, and in the backward v too; MLA's q, k and v pieces): H heads of D read
// from x (element strides over B, T, H; unit-stride last dim) and written to out (out_st elements
// between tokens, out_sh between heads), rotated, copied as they are (rotate = false), or zeros
// (x null). Rotated parts take the launch's D; copied and zero parts may have their own.
struct RopePart {
  const void* x = nullptr;
  int64_t x_sb = 0, x_st = 0, x_sh = 0;
  int64_t H = 0;
  void* out = nullptr;
  int64_t out_st = 0;
  bool rotate = true;
  int64_t D = 0;       // head width; 0: the launch's D
  int64_t out_sh = 0;  // elements between heads in out; 0: D (heads contiguous)
};
constexpr int kRopeMaxParts = 6;
struct RopeParts {
  int64_t B = 0, T = 0, D = 0;     // D: the rotated parts' head width (the tables' 2 × columns)
  int64_t pos_sb = 0, pos_st = 0;  // element strides of the int64 positions [B,T]
  int n = 0;                       // parts used, 1..kRopeMaxParts
  RopePart part[kRopeMaxParts];
};

#ifdef DD_HAVE_CUDA
// Returns the cudaError_t of the launch (0 = success). out and x have dtype `dt`; out is contiguous.
int rope_apply(void* out, const void* x, DType dt, const int64_t* pos, const double* cos, const double* sin,
               const RopeShape& s, bool inverse, void* stream);

// Every part in one launch (one block per token). Returns the cudaError_t of the launch.
int rope_apply_parts(const RopeParts& p, DType dt, const int64_t* pos, const double* cos, const double* sin,
                     bool inverse, void* stream);

// RoPE followed by the weight-free QK-norm of each head (the GPT mixer's qk_norm), in one pass:
//   z = rope(x),  y = z · r,  r = 1/sqrt(mean(z²) + eps)  per (token, head)
// y contiguous [B,T,H,D]; rstd [B·T·H] fp32 (kept for the backward). Only head dims whose D/2 pairs
// split into a power-of-two number of threads (≤ 32) per head are taken (rope_rmsnorm_supported).
bool rope_rmsnorm_supported(DType dt, const RopeShape& s, const void* x);
int rope_rmsnorm_forward(void* y, float* rstd, const void* x, DType dt, const int64_t* pos, const double* cos,
                         const double* sin, const RopeShape& s, float eps, void* stream);
// dz = r · (dy − y · mean(dy · y)), dx = rope⁻¹(dz). dy, y contiguous [B,T,H,D]; dx contiguous.
int rope_rmsnorm_backward(void* dx, const void* dy, const void* y, const float* rstd, DType dt, const int64_t* pos,
                          const double* cos, const double* sin, const RopeShape& s, void* stream);

// The backward of RoPE + QK-norm on q and k out of a fused q|k|v projection, and v's gradient
// passed through, in one launch (one block per token): each token's row of dqkv [B·T, (nh + 2 nkv)
// · D] gets rope⁻¹ of the norm's backward of dq (then dk) in its q (k) columns, as
// rope_rmsnorm_backward computes them, and dv copied into its v columns; a null gradient writes
// zeros. dq, dk, yq, yk contiguous [B,T,H,D]; dv [B,T,nkv,D] with a unit-stride last dim (its other
// strides multiples of 8 bytes' elements, 8-byte aligned). Head dims as rope_rmsnorm_supported takes.
struct RopeNormQkvGrads {
  void* dqkv = nullptr;
  const void *dq = nullptr, *dk = nullptr, *yq = nullptr, *yk = nullptr;
  const float *rstd_q = nullptr, *rstd_k = nullptr;  // [B·T·nh], [B·T·nkv]
  const void* dv = nullptr;
  int64_t dv_sb = 0, dv_st = 0, dv_sh = 0;
  int64_t B = 0, T = 0, nh = 0, nkv = 0, D = 0;
  int64_t pos_sb = 0, pos_st = 0;
};
int rope_rmsnorm_qkv_backward(const RopeNormQkvGrads& g, DType dt, const int64_t* pos, const double* cos,
                              const double* sin, void* stream);
#endif

}  // namespace kernels
