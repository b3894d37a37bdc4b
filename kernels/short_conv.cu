// Short convolution: one block per (128 channels, tile of kTile consecutive tokens of one row). The
// block first copies its tile of x (with the W − 1 tokens before it, and for the backward the W − 1
// after it), of dy and of the document positions into shared memory, all threads together, in
// 16-byte loads where the rows allow; then each thread walks its channel's tokens in order from
// shared memory with the last W inputs (and, backward, the last W pre-activation gradients) in
// registers. Loading token by token from global memory instead, every thread waited on one memory
// round trip per token and the backward ran at a fifth of the memory bandwidth. The backward's
// weight gradient is summed per thread over its tile and added with one fp32 atomic per tap
// (R·T/kTile additions per weight).
#include <cuda_runtime.h>

#include <climits>

#include "kernels/elem.cuh"
#include "kernels/short_conv.h"

namespace kernels {

namespace {

constexpr int kThreads = 128;  // channels per block
// Tokens per block: the staged tiles of x and dy fit the 48 KiB of static shared memory.
template <typename T>
__host__ __device__ constexpr int tile_of() {
  return sizeof(T) == 4 ? 32 : 64;
}

__device__ __forceinline__ float sigmoid(float s) { return 1.f / (1.f + __expf(-s)); }

// Tap i of token t (row-local index) reaches a token of the same document; p is the token's
// position in its document (INT_MAX for rows without document positions).
__device__ __forceinline__ bool tap_ok(int64_t t, int i, int p) { return t - i >= 0 && p >= i; }

// Copies tokens [ta, ta + n) of one row (token stride ld; tokens outside [0, T_len) read as 0) ×
// channels [c0, c0 + kThreads) (those ≥ C read as 0) into dst [n][kThreads]. `vec`: 16-byte loads
// (the caller checked C, ld and the pointer allow them), four per thread in flight at a time.
template <typename T>
__device__ __forceinline__ void stage_rows(T* dst, const T* src, int64_t ld, int64_t ta, int n, int64_t T_len,
                                           int64_t c0, int64_t C, bool vec) {
  if (vec) {
    constexpr int V = 16 / sizeof(T), kPerRow = kThreads / V, kBatch = 4;
    const int total = n * kPerRow;
    for (int base = threadIdx.x; base < total; base += kBatch * kThreads) {
      Vec<T, V> v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * kThreads;
        const int64_t t = ta + i / kPerRow, c = c0 + (i % kPerRow) * V;
        if (i < total && t >= 0 && t < T_len && c < C) {
          v[u].load(src + t * ld + c);
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e) v[u].set(e, 0.f);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * kThreads;
        if (i < total) v[u].store(dst + (i / kPerRow) * kThreads + (i % kPerRow) * V);
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < n * kThreads; i += kThreads) {
    const int64_t t = ta + i / kThreads, c = c0 + i % kThreads;
    dst[i] = (t >= 0 && t < T_len && c < C) ? src[t * ld + c] : from_f32<T>(0.f);
  }
}

// Positions of tokens [ta, ta + n) of one row into dst (INT_MAX without positions or outside the row).
__device__ __forceinline__ void stage_positions(int* dst, const int64_t* pos_row, int64_t ta, int n, int64_t T_len) {
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const int64_t t = ta + i;
    // Positions fit an int: a row is shorter than 2³¹ tokens.
    dst[i] = (pos_row != nullptr && t >= 0 && t < T_len) ? static_cast<int>(pos_row[t]) : INT_MAX;
  }
}

template <typename T, int W>
__global__ void __launch_bounds__(kThreads) short_conv_forward_kernel(T* y, const T* x, const float* w,
                                                                      const int64_t* pos, int64_t T_len, int64_t C,
                                                                      int64_t ld, bool vec) {
  constexpr int kTile = tile_of<T>();
  __shared__ __align__(16) T x_s[(kTile + W - 1) * kThreads];
  __shared__ int p_s[kTile];
  const int64_t c0 = blockIdx.x * static_cast<int64_t>(kThreads), c = c0 + threadIdx.x;
  const int64_t tiles = (T_len + kTile - 1) / kTile;
  const int64_t r = blockIdx.y / tiles, t0 = (blockIdx.y % tiles) * kTile;
  const int64_t t1 = min(t0 + kTile, T_len);
  const int64_t xa = t0 - (W - 1);  // x_s row 0
  stage_rows(x_s, x + r * T_len * ld, ld, xa, static_cast<int>(t1 - xa), T_len, c0, C, vec);
  stage_positions(p_s, pos ? pos + r * T_len : nullptr, t0, static_cast<int>(t1 - t0), T_len);
  __syncthreads();
  if (c >= C) return;
  float wc[W];
#pragma unroll
  for (int j = 0; j < W; ++j) wc[j] = w[c * W + j];
  for (int64_t t = t0; t < t1; ++t) {
    const int p = p_s[t - t0];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < W; ++i)
      if (tap_ok(t, i, p)) s += wc[W - 1 - i] * to_f32(x_s[(t - i - xa) * kThreads + threadIdx.x]);
    y[(r * T_len + t) * C + c] = from_f32<T>(s * sigmoid(s));
  }
}

template <typename T, int W>
__global__ void __launch_bounds__(kThreads) short_conv_backward_kernel(T* dx, float* dw, const T* dy, const T* x,
                                                                       const float* w, const int64_t* pos,
                                                                       int64_t T_len, int64_t C, int64_t ld,
                                                                       int64_t ld_dx, bool vec_x, bool vec_dy) {
  constexpr int kTile = tile_of<T>();
  __shared__ __align__(16) T x_s[(kTile + 2 * (W - 1)) * kThreads];
  __shared__ __align__(16) T dy_s[(kTile + W - 1) * kThreads];
  __shared__ int p_s[kTile + W - 1];
  const int64_t c0 = blockIdx.x * static_cast<int64_t>(kThreads), c = c0 + threadIdx.x;
  const int64_t tiles = (T_len + kTile - 1) / kTile;
  const int64_t r = blockIdx.y / tiles, t0 = (blockIdx.y % tiles) * kTile;
  const int64_t t1 = min(t0 + kTile, T_len);
  // Token t's pre-activation gradient is needed by dx of tokens t−W+1..t, so the walk runs W−1
  // tokens past the tile (ds = 0 past the row's end); s of those needs x from W−1 tokens back.
  const int64_t t_end = t1 + W - 1;
  const int64_t xa = t0 - (W - 1);  // x_s row 0; dy_s and p_s start at t0
  stage_rows(x_s, x + r * T_len * ld, ld, xa, static_cast<int>(t_end - xa), T_len, c0, C, vec_x);
  stage_rows(dy_s, dy + r * T_len * C, C, t0, static_cast<int>(t_end - t0), T_len, c0, C, vec_dy);
  stage_positions(p_s, pos ? pos + r * T_len : nullptr, t0, static_cast<int>(t_end - t0), T_len);
  __syncthreads();
  if (c >= C) return;
  T* dxr = dx + r * T_len * ld_dx + c;
  float wc[W], dsw[W], dwc[W];
  bool okw[W][W];  // okw[j][i]: tap i of token (t − (W−1) + j) is valid
#pragma unroll
  for (int j = 0; j < W; ++j) {
    wc[j] = w[c * W + j];
    dwc[j] = 0.f;
    dsw[j] = 0.f;
#pragma unroll
    for (int i = 0; i < W; ++i) okw[j][i] = false;
  }
  auto x_at = [&](int64_t t) { return to_f32(x_s[(t - xa) * kThreads + threadIdx.x]); };
  for (int64_t t = t0; t < t_end; ++t) {
#pragma unroll
    for (int j = 0; j < W - 1; ++j) {
      dsw[j] = dsw[j + 1];
#pragma unroll
      for (int i = 0; i < W; ++i) okw[j][i] = okw[j + 1][i];
    }
    float ds = 0.f;
    if (t < T_len) {
      const int p = p_s[t - t0];
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        okw[W - 1][i] = tap_ok(t, i, p);
        if (okw[W - 1][i]) s += wc[W - 1 - i] * x_at(t - i);
      }
      const float sg = sigmoid(s);
      ds = to_f32(dy_s[(t - t0) * kThreads + threadIdx.x]) * sg * (1.f + s * (1.f - sg));
      if (t < t1) {
#pragma unroll
        for (int i = 0; i < W; ++i)
          if (okw[W - 1][i]) dwc[W - 1 - i] += ds * x_at(t - i);
      }
    } else {
#pragma unroll
      for (int i = 0; i < W; ++i) okw[W - 1][i] = false;
    }
    dsw[W - 1] = ds;
    // Token t − (W−1) has every later gradient it needs now: dsw[i] belongs to token t − (W−1) + i.
    const int64_t tp = t - (W - 1);
    if (tp >= t0) {
      float g = 0.f;
#pragma unroll
      for (int i = 0; i < W; ++i)
        if (okw[i][i]) g += dsw[i] * wc[W - 1 - i];
      dxr[tp * ld_dx] = from_f32<T>(g);
    }
  }
#pragma unroll
  for (int j = 0; j < W; ++j) atomicAdd(dw + c * W + j, dwc[j]);
}

// Whether rows of C channels at token stride ld from p can be staged in 16-byte pieces.
template <typename T>
bool rows_vectorizable(const void* p, int64_t C, int64_t ld) {
  constexpr int V = 16 / sizeof(T);
  return C % V == 0 && ld % V == 0 && aligned_to(16, p);
}

template <typename T, int W>
int launch_forward(void* y, const void* x, const float* w, const int64_t* pos, int64_t R, int64_t T_len, int64_t C,
                   int64_t ld, cudaStream_t st) {
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads),
                  static_cast<unsigned>(R * ((T_len + tile_of<T>() - 1) / tile_of<T>())));
  short_conv_forward_kernel<T, W><<<grid, kThreads, 0, st>>>(static_cast<T*>(y), static_cast<const T*>(x), w, pos,
                                                             T_len, C, ld, rows_vectorizable<T>(x, C, ld));
  return static_cast<int>(cudaGetLastError());
}

template <typename T, int W>
int launch_backward(void* dx, float* dw, const void* dy, const void* x, const float* w, const int64_t* pos, int64_t R,
                    int64_t T_len, int64_t C, int64_t ld, int64_t ld_dx, cudaStream_t st) {
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads),
                  static_cast<unsigned>(R * ((T_len + tile_of<T>() - 1) / tile_of<T>())));
  short_conv_backward_kernel<T, W><<<grid, kThreads, 0, st>>>(
      static_cast<T*>(dx), dw, static_cast<const T*>(dy), static_cast<const T*>(x), w, pos, T_len, C, ld, ld_dx,
      rows_vectorizable<T>(x, C, ld), rows_vectorizable<T>(dy, C, C));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

// The kernels are built for these tap counts; any other W is cudaErrorInvalidValue.
#define DD_SHORT_CONV_TAPS(T, CALL) \
  switch (W) {                      \
    case 2: return CALL(T, 2);      \
    case 3: return CALL(T, 3);      \
    case 4: return CALL(T, 4);      \
    case 6: return CALL(T, 6);      \
    case 8: return CALL(T, 8);      \
    default: return static_cast<int>(cudaErrorInvalidValue); \
  }

int short_conv_forward(void* y, const void* x, DType dt, const float* w, const int64_t* pos, int64_t R, int64_t T,
                       int64_t C, int64_t ld, int W, void* stream) {
  if (R * T == 0 || C == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
#define DD_FWD(E, K) launch_forward<E, K>(y, x, w, pos, R, T, C, ld, st)
  switch (dt) {
    case DType::F32: DD_SHORT_CONV_TAPS(float, DD_FWD)
    case DType::BF16: DD_SHORT_CONV_TAPS(__nv_bfloat16, DD_FWD)
    case DType::F16: DD_SHORT_CONV_TAPS(__half, DD_FWD)
  }
#undef DD_FWD
  return static_cast<int>(cudaErrorInvalidValue);
}

int short_conv_backward(void* dx, float* dw, const void* dy, const void* x, DType dt, const float* w,
                        const int64_t* pos, int64_t R, int64_t T, int64_t C, int64_t ld, int W, void* stream,
                        int64_t ld_dx) {
  if (R * T == 0 || C == 0) return 0;
  if (ld_dx == 0) ld_dx = C;
  if (ld_dx < C) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
#define DD_BWD(E, K) launch_backward<E, K>(dx, dw, dy, x, w, pos, R, T, C, ld, ld_dx, st)
  switch (dt) {
    case DType::F32: DD_SHORT_CONV_TAPS(float, DD_BWD)
    case DType::BF16: DD_SHORT_CONV_TAPS(__nv_bfloat16, DD_BWD)
    case DType::F16: DD_SHORT_CONV_TAPS(__half, DD_BWD)
  }
#undef DD_BWD
  return static_cast<int>(cudaErrorInvalidValue);
}

#undef DD_SHORT_CONV_TAPS

}  // namespace kernels
