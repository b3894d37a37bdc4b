// Short convolution: one thread per (channel, tile of kTile consecutive tokens of one row), walking
// its tokens in order with the last W inputs (and, backward, the last W pre-activation gradients) in
// registers; a warp's 32 threads are 32 neighbouring channels, so every load and store of a token is
// coalesced. The backward's weight gradient is summed per thread over its tile and added with one
// fp32 atomic per tap (R·T/kTile additions per weight).
#include <cuda_runtime.h>

#include <climits>

#include "kernels/elem.cuh"
#include "kernels/short_conv.h"

namespace kernels {

namespace {

constexpr int kTile = 128;     // tokens per thread
constexpr int kThreads = 128;  // channels per block
// Tokens whose loads a thread issues together. The walk over a tile is sequential, so loading one
// token per iteration left each thread waiting on one memory round trip per token (the backward ran
// at a fifth of the memory bandwidth).
constexpr int kGroup = 8;

__device__ __forceinline__ float sigmoid(float s) { return 1.f / (1.f + __expf(-s)); }

// Tap i of token t (row-local index) reaches a token of the same document; p is the token's
// position in its document (INT_MAX for rows without document positions).
__device__ __forceinline__ bool tap_ok(int64_t t, int i, int p) { return t - i >= 0 && p >= i; }

template <typename T, int W>
__global__ void short_conv_forward_kernel(T* y, const T* x, const float* w, const int64_t* pos, int64_t T_len,
                                          int64_t C, int64_t ld) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (c >= C) return;
  const int64_t tiles = (T_len + kTile - 1) / kTile;
  const int64_t r = blockIdx.y / tiles, t0 = (blockIdx.y % tiles) * kTile;
  const int64_t t1 = min(t0 + kTile, T_len);
  const T* xr = x + r * T_len * ld + c;
  const int64_t* pr = pos ? pos + r * T_len : nullptr;
  float wc[W], xw[W];  // xw[W−1−i] = x[t−i]
#pragma unroll
  for (int j = 0; j < W; ++j) wc[j] = w[c * W + j];
#pragma unroll
  for (int j = 0; j < W - 1; ++j) {
    const int64_t t = t0 - (W - 1) + j;
    xw[j + 1] = t >= 0 ? to_f32(xr[t * ld]) : 0.f;
  }
  for (int64_t tg = t0; tg < t1; tg += kGroup) {
    // All of the group's loads first, then its arithmetic: one memory round trip per group.
    float xg[kGroup];
    int pg[kGroup];  // positions fit an int: a row is shorter than 2³¹ tokens
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int64_t t = tg + u;
      xg[u] = t < t1 ? to_f32(xr[t * ld]) : 0.f;
      pg[u] = (pr != nullptr && t < t1) ? static_cast<int>(pr[t]) : INT_MAX;
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int64_t t = tg + u;
      if (t >= t1) break;
#pragma unroll
      for (int j = 0; j < W - 1; ++j) xw[j] = xw[j + 1];
      xw[W - 1] = xg[u];
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < W; ++i)
        if (tap_ok(t, i, pg[u])) s += wc[W - 1 - i] * xw[W - 1 - i];
      y[(r * T_len + t) * C + c] = from_f32<T>(s * sigmoid(s));
    }
  }
}

template <typename T, int W>
__global__ void short_conv_backward_kernel(T* dx, float* dw, const T* dy, const T* x, const float* w,
                                           const int64_t* pos, int64_t T_len, int64_t C, int64_t ld) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (c >= C) return;
  const int64_t tiles = (T_len + kTile - 1) / kTile;
  const int64_t r = blockIdx.y / tiles, t0 = (blockIdx.y % tiles) * kTile;
  const int64_t t1 = min(t0 + kTile, T_len);
  const T* xr = x + r * T_len * ld + c;
  const T* dyr = dy + r * T_len * C + c;
  T* dxr = dx + r * T_len * C + c;
  const int64_t* pr = pos ? pos + r * T_len : nullptr;
  float wc[W], xw[W], dsw[W], dwc[W];
  bool okw[W][W];  // okw[j][i]: tap i of token (t − (W−1) + j) is valid
#pragma unroll
  for (int j = 0; j < W; ++j) {
    wc[j] = w[c * W + j];
    dwc[j] = 0.f;
    dsw[j] = 0.f;
#pragma unroll
    for (int i = 0; i < W; ++i) okw[j][i] = false;
  }
#pragma unroll
  for (int j = 0; j < W - 1; ++j) {
    const int64_t t = t0 - (W - 1) + j;
    xw[j + 1] = t >= 0 ? to_f32(xr[t * ld]) : 0.f;
  }
  // Token t's pre-activation gradient is needed by dx of tokens t−W+1..t, so the walk runs W−1
  // tokens past the tile (ds = 0 past the row's end).
  const int64_t t_end = t1 + W - 1;
  for (int64_t tg = t0; tg < t_end; tg += kGroup) {
    // All of the group's loads first, then its arithmetic: one memory round trip per group.
    float xg[kGroup], dyg[kGroup];
    int pg[kGroup];  // positions fit an int: a row is shorter than 2³¹ tokens
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int64_t t = tg + u;
      const bool in = t < t_end && t < T_len;
      xg[u] = in ? to_f32(xr[t * ld]) : 0.f;
      dyg[u] = in ? to_f32(dyr[t * C]) : 0.f;
      pg[u] = (pr != nullptr && in) ? static_cast<int>(pr[t]) : INT_MAX;
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int64_t t = tg + u;
      if (t >= t_end) break;
#pragma unroll
      for (int j = 0; j < W - 1; ++j) {
        xw[j] = xw[j + 1];
        dsw[j] = dsw[j + 1];
#pragma unroll
        for (int i = 0; i < W; ++i) okw[j][i] = okw[j + 1][i];
      }
      float ds = 0.f;
      if (t < T_len) {
        xw[W - 1] = xg[u];
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < W; ++i) {
          okw[W - 1][i] = tap_ok(t, i, pg[u]);
          if (okw[W - 1][i]) s += wc[W - 1 - i] * xw[W - 1 - i];
        }
        const float sg = sigmoid(s);
        ds = dyg[u] * sg * (1.f + s * (1.f - sg));
        if (t < t1) {
#pragma unroll
          for (int i = 0; i < W; ++i)
            if (okw[W - 1][i]) dwc[W - 1 - i] += ds * xw[W - 1 - i];
        }
      } else {
        xw[W - 1] = 0.f;
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
        dxr[tp * C] = from_f32<T>(g);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < W; ++j) atomicAdd(dw + c * W + j, dwc[j]);
}

template <typename T, int W>
int launch_forward(void* y, const void* x, const float* w, const int64_t* pos, int64_t R, int64_t T_len, int64_t C,
                   int64_t ld, cudaStream_t st) {
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads),
                  static_cast<unsigned>(R * ((T_len + kTile - 1) / kTile)));
  short_conv_forward_kernel<T, W><<<grid, kThreads, 0, st>>>(static_cast<T*>(y), static_cast<const T*>(x), w, pos,
                                                             T_len, C, ld);
  return static_cast<int>(cudaGetLastError());
}

template <typename T, int W>
int launch_backward(void* dx, float* dw, const void* dy, const void* x, const float* w, const int64_t* pos, int64_t R,
                    int64_t T_len, int64_t C, int64_t ld, cudaStream_t st) {
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads),
                  static_cast<unsigned>(R * ((T_len + kTile - 1) / kTile)));
  short_conv_backward_kernel<T, W><<<grid, kThreads, 0, st>>>(
      static_cast<T*>(dx), dw, static_cast<const T*>(dy), static_cast<const T*>(x), w, pos, T_len, C, ld);
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
                        const int64_t* pos, int64_t R, int64_t T, int64_t C, int64_t ld, int W, void* stream) {
  if (R * T == 0 || C == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
#define DD_BWD(E, K) launch_backward<E, K>(dx, dw, dy, x, w, pos, R, T, C, ld, st)
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
