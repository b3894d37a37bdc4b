// Short convolution: one block per (128 channels, tile of consecutive tokens of one row: 64 tokens
// forward, 48 backward for 16-bit rows, 32 for fp32; the backward's channels are those of one part,
// see short_conv_backward_parts). The block first copies its tile of x (with the W − 1 tokens
// before it, and for the backward the W − 1 after it), of dy and of the document positions into
// shared memory, all threads together, by 16-byte cp.async copies where the rows allow (every copy
// of the tile in flight at once); then each thread walks its channel's tokens in order from shared
// memory with the last W inputs (and, backward, the last W pre-activation gradients and positions)
// in registers, reading one staged value of x (and dy) per token.
//
// These kernels are bound by instruction issue and latency more than by memory (ncu on an H200,
// hybrid base's q|k|v backward before the groups below: 79% of issue slots busy at 34% of DRAM
// bandwidth; at stop 77, 58 instructions a token and channel in all, about 30 of them the walk's
// and 13 the staging's, SASS). So the walk reads one staged value of x (and dy) per token; it tests
// a group of W tokens against document starts once (group_whole) and walks the group without tests
// when none starts there (taps before the row's start read staged zeros); and it writes each output
// into its tile's shared memory rows (the forward's x rows, the backward's dy rows, already read),
// which the block then stores 16 bytes at a time: one store a token, with its 64-bit address, had
// been a sixth of the backward's instructions. Loading token by token from global memory instead,
// every thread waited on one memory round trip per token and the backward ran at a fifth of the
// memory bandwidth. The backward's weight gradient is summed per thread over its tile and added
// with one fp32 atomic per tap (R·T/tile additions per weight).
//
// The staging copies each take about 3 instructions in a tile inside its row (stage_rows): hybrid
// base's backward 98 -> 90 µs a layer (69M -> 58M instructions a launch), its forward 48 -> 45
// (docs/perf.md stop 78). Two channels a thread (one 32-bit shared load and store a pair, a fifth
// fewer instructions a value) ran the backward slower, 112 µs a layer: blocks of 64 threads, half
// the warps an SM.
//
// One backward launch takes every part of the Gated DeltaNet's q|k|v conv, each with its own dy:
// three launches of a few waves each left the SMs idle in their tails (hybrid base's 576-wide
// parts took 1.6 waves each).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "kernels/cp_async.cuh"
#include "kernels/elem.cuh"
#include "kernels/fast_sigmoid.cuh"
#include "kernels/short_conv.h"

namespace kernels {

namespace {

constexpr int kThreads = 128;  // channels per block
// The forward's tokens per block: its staged tile of x fits the 48 KiB of static shared memory.
template <typename T>
__host__ __device__ constexpr int tile_of() {
  return sizeof(T) == 4 ? 32 : 64;
}
// The backward's, with tiles of x and dy: 16-bit rows take 48 tokens, 27 KiB a block at W = 4, so
// 8 blocks an SM instead of 6 at 64 tokens (on an H200, hybrid base's q|k|v: 0.121 ms at 64
// tokens, 0.113 at 48).
template <typename T>
__host__ __device__ constexpr int backward_tile_of() {
  return sizeof(T) == 4 ? 32 : 48;
}

// Copies tokens [ta, ta + n) of one row (token stride ld; tokens outside [0, T_len) read as 0) ×
// channels [c0, c0 + kThreads) (those ≥ C read as 0) of src into dst [n][kThreads]. `vec`: 16-byte
// cp.async copies (the caller checked C, ld and the pointer allow them), all of them started at
// once, so a block waits one memory round trip for its whole tile; the caller then runs
// cp_async_wait_all() and __syncthreads().
template <typename T>
__device__ __forceinline__ void stage_rows(T* dst, const T* src, int64_t ld, int64_t ta, int n, int64_t T_len,
                                           int64_t c0, int64_t C, bool vec) {
  if (vec) {
    // The thread's piece is the same column of every row it copies (piece threadIdx % kPerRow of
    // rows threadIdx / kPerRow, + kStep, ...), so its source steps by a pointer add and its test
    // is the row's: working out each piece's row and column afresh took about 37 instructions a
    // copy (SASS), a fifth of the backward's instructions.
    constexpr int V = 16 / sizeof(T), kPerRow = kThreads / V, kStep = kThreads / kPerRow;
    const int k = (threadIdx.x % kPerRow) * V;
    const bool col_in = c0 + k < C;
    int i = threadIdx.x / kPerRow;
    int64_t t = ta + i;
    const T* s = src + t * ld + c0 + k;
    T* d = dst + i * kThreads + k;
    if (col_in && ta >= 0 && ta + n <= T_len) {  // every row inside the row's tokens: no tests
      for (; i < n; i += kStep, s += kStep * ld, d += kStep * kThreads) cp_async16(d, s);
      return;
    }
    for (; i < n; i += kStep, t += kStep, s += kStep * ld, d += kStep * kThreads) {
      if (col_in && t >= 0 && t < T_len) cp_async16(d, s);
      else *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
    return;
  }
  for (int i = threadIdx.x; i < n * kThreads; i += kThreads) {
    const int64_t t = ta + i / kThreads, c = c0 + i % kThreads;
    dst[i] = (t >= 0 && t < T_len && c < C) ? src[t * ld + c] : from_f32<T>(0.f);
  }
}

// Positions of tokens [ta, ta + n) of one row into dst (ta ≥ 0): INT_MAX without positions (no
// document starts), 0 past the row's end. The backward's walk runs W − 1 tokens past the row's
// end, where ds is 0; a 0 there keeps the window's real tokens tested against their documents'
// starts (INT_MAX would mark the window whole, and a document starting in the row's last W − 2
// tokens would pass gradient back into the one before it).
__device__ __forceinline__ void stage_positions(int* dst, const int64_t* pos_row, int64_t ta, int n, int64_t T_len) {
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const int64_t t = ta + i;
    // Positions fit an int: a row is shorter than 2³¹ tokens.
    dst[i] = t >= T_len ? 0 : (pos_row != nullptr ? static_cast<int>(pos_row[t]) : INT_MAX);
  }
}

// Copies rows [0, n) of src [n][kThreads] (a block's output tile, staged in shared memory) to n
// rows of dst at token stride ld, into channels c0 + k of each (k < kThreads; channels ≥ C are left
// alone). `vec`: 16-byte stores (the caller checked C, ld and the pointer allow them); one store
// instruction moves eight bf16 outputs, where the walk's own stores moved one each and worked out
// a 64-bit address for each. Runs after a __syncthreads that follows the tile's last write.
template <typename T>
__device__ __forceinline__ void store_rows(T* dst, const T* src, int64_t ld, int n, int64_t c0, int64_t C, bool vec) {
  if (vec) {  // one column of every kStep-th row a thread, as stage_rows
    constexpr int V = 16 / sizeof(T), kPerRow = kThreads / V, kStep = kThreads / kPerRow;
    const int k = (threadIdx.x % kPerRow) * V;
    if (c0 + k >= C) return;
    int i = threadIdx.x / kPerRow;
    T* d = dst + i * ld + c0 + k;
    const T* s = src + i * kThreads + k;
    for (; i < n; i += kStep, d += kStep * ld, s += kStep * kThreads)
      *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(s);
    return;
  }
  for (int i = threadIdx.x; i < n * kThreads; i += kThreads) {
    const int row = i / kThreads, k = i % kThreads;
    if (c0 + k < C) dst[row * ld + c0 + k] = src[i];
  }
}

// Positions of steps [i0, i0 + W) into p; whether each of those tokens is at least W − 1 tokens
// into its document (or the row has no positions), so that none of their taps needs testing. The
// walks test a group of W tokens once and take a copy of their steps without tests when it passes.
template <int W>
__device__ __forceinline__ bool group_whole(const int* p_s, int i0, int* p) {
  int m = INT_MAX;
#pragma unroll
  for (int u = 0; u < W; ++u) {
    p[u] = p_s[i0 + u];
    m = min(m, p[u]);
  }
  return m >= W - 1;
}

// One token of the forward's walk: its input into ring slot `newest` (entry j of the window, oldest
// first, is slot (newest + 1 + j) % W), its output into ys. Taps reaching before the document's
// start (position p) are left out, unless `whole` says none does; taps before the row's start need
// no test: their inputs were staged as zeros.
template <typename T, int W>
__device__ __forceinline__ void forward_step(float* xr, int newest, const float* wc, float x_new, int p, bool whole,
                                             T* y_out) {
  xr[newest] = x_new;
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < W; ++j)
    if (whole || p >= W - 1 - j) s += wc[j] * xr[(newest + 1 + j) % W];
  *y_out = from_f32<T>(s * fast_sigmoid(s));
}

// W steps of the forward's walk from step i0 (a multiple of W, so each step's ring slot is a
// constant); kWhole: group_whole passed, and no tap is tested.
template <typename T, int W, bool kWhole>
__device__ __forceinline__ void forward_group(float* xr, const float* wc, const T* xs, T* ys, int i0, const int* p) {
#pragma unroll
  for (int u = 0; u < W; ++u) {
    const int i = i0 + u;
    forward_step<T, W>(xr, u, wc, to_f32(xs[(i + W - 1) * kThreads]), p[u], kWhole || p[u] >= W - 1,
                       ys + i * kThreads);
  }
}

// The (row, token tile) pairs are the grid's y·z blocks, row-major: one grid dimension holds at
// most 65535 blocks, about 3.1M tokens a call at 48-token tiles, so the rest go to z.
// row_tiles_grid is the launch's grid for `row_tiles` pairs; row_tile_of a block's pair, or −1
// for a block past the last (the y·z rectangle's spare corner), which returns at once.
dim3 row_tiles_grid(int64_t channel_blocks, int64_t row_tiles) {
  const int64_t y = std::min<int64_t>(row_tiles, 65535);
  return dim3(static_cast<unsigned>(channel_blocks), static_cast<unsigned>(y),
              static_cast<unsigned>((row_tiles + y - 1) / y));
}
__device__ __forceinline__ int64_t row_tile_of(int64_t row_tiles) {
  const int64_t i = static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
  return i < row_tiles ? i : -1;
}

template <typename T, int W>
__global__ void __launch_bounds__(kThreads) short_conv_forward_kernel(T* y, const T* x, const float* w,
                                                                      const int64_t* pos, int64_t R, int64_t T_len,
                                                                      int64_t C, int64_t ld, bool vec, bool vec_y) {
  constexpr int kTile = tile_of<T>();
  __shared__ __align__(16) T x_s[(kTile + W - 1) * kThreads];
  __shared__ int p_s[kTile];
  const int64_t c0 = blockIdx.x * static_cast<int64_t>(kThreads), c = c0 + threadIdx.x;
  const int64_t tiles = (T_len + kTile - 1) / kTile, row_tile = row_tile_of(R * tiles);
  if (row_tile < 0) return;
  const int64_t r = row_tile / tiles, t0 = (row_tile % tiles) * kTile;
  const int64_t t1 = min(t0 + kTile, T_len);
  const int64_t xa = t0 - (W - 1);  // x_s row 0
  const int n = static_cast<int>(t1 - t0);
  stage_rows(x_s, x + r * T_len * ld, ld, xa, static_cast<int>(t1 - xa), T_len, c0, C, vec);
  stage_positions(p_s, pos ? pos + r * T_len : nullptr, t0, n, T_len);
  cp_async_wait_all();
  __syncthreads();
  if (c < C) {
    float wc[W], xr[W];  // xr: ring of the last W inputs, token t0 + i's in slot i % W
#pragma unroll
    for (int j = 0; j < W; ++j) wc[j] = w[c * W + j];
    const T* xs = x_s + threadIdx.x;  // row i: token xa + i
    // Token t0 + i's output goes into x_s row i, whose input step i − (W − 1) has read already.
    T* ys = x_s + threadIdx.x;
    // Slots 1..W−1: the W − 1 inputs before the tile (slot 0 takes step 0's).
#pragma unroll
    for (int j = 0; j < W - 1; ++j) xr[j + 1] = to_f32(xs[j * kThreads]);
    int i0 = 0;
    for (; i0 + W <= n; i0 += W) {
      int p[W];
      if (group_whole<W>(p_s, i0, p)) forward_group<T, W, true>(xr, wc, xs, ys, i0, p);
      else forward_group<T, W, false>(xr, wc, xs, ys, i0, p);
    }
#pragma unroll
    for (int u = 0; u < W; ++u) {  // the tile's last n % W tokens
      const int i = i0 + u;
      if (i >= n) break;
      forward_step<T, W>(xr, u, wc, to_f32(xs[(i + W - 1) * kThreads]), p_s[i], p_s[i] >= W - 1,
                         ys + i * kThreads);
    }
  }
  __syncthreads();
  store_rows(y + (r * T_len + t0) * C, x_s, C, n, c0, C, vec_y);
}

// The backward's window: the last W inputs (xr), pre-activation gradients (dsr) and positions
// (pr) in ring slots; `newest` is the slot the token goes into, a constant once the walk is
// unrolled by W, so the window slides by renaming registers, not moving them. Entry j of the
// window, oldest first, is slot (newest + 1 + j) % W.
template <int W>
struct ConvWindow {
  float xr[W], dsr[W];
  int pr[W];
};

// silu'(s) = σ(s) (1 + s (1 − σ(s))), as σ + (s − s σ) σ: two FMAs where the plain form took four
// instructions (the walk's arithmetic is most of the backward's instructions).
__device__ __forceinline__ float silu_grad(float s, float sg) { return fmaf(fmaf(-s, sg, s), sg, sg); }

// One token of the backward's walk, its input already in win.xr[newest]: its pre-activation
// gradient into the window (and the weight gradients' sums when sum_dw), and the input gradient
// of the token W − 1 back, which has every later gradient it needs now (tap k of token
// t − (W−1) + k), returned. `whole`: the token is at least W − 1 tokens into its position p in
// its document (or the row has no positions), so no tap of it, and none of the W − 1 tokens
// before it, needs testing against a document start; p ≥ W − 1, or a constant true where the
// caller knows it.
template <int W>
__device__ __forceinline__ float backward_step(ConvWindow<W>& win, int newest, const float* wc, float* dwc,
                                               float dy_new, int p, bool whole, bool sum_dw) {
  win.pr[newest] = p;
#define XW(j) win.xr[(newest + 1 + (j)) % W]
#define DSW(j) win.dsr[(newest + 1 + (j)) % W]
#define PW(j) win.pr[(newest + 1 + (j)) % W]
  // One test of `whole` for the token's three sums: with a test for each, the compiler kept a
  // branch region for each (hybrid base's backward 0.91 -> 0.83 ms a step with one). The same sums
  // in the same order.
  float s = 0.f, g = 0.f;
  if (whole) {
#pragma unroll
    for (int j = 0; j < W; ++j) s += wc[j] * XW(j);
    const float ds = dy_new * silu_grad(s, fast_sigmoid(s));
    if (sum_dw) {
#pragma unroll
      for (int j = 0; j < W; ++j) dwc[j] += ds * XW(j);
    }
    win.dsr[newest] = ds;
#pragma unroll
    for (int k = 0; k < W; ++k) g += DSW(k) * wc[W - 1 - k];
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (p >= W - 1 - j) s += wc[j] * XW(j);
    const float ds = dy_new * silu_grad(s, fast_sigmoid(s));
    if (sum_dw) {
#pragma unroll
      for (int j = 0; j < W; ++j)
        if (p >= W - 1 - j) dwc[j] += ds * XW(j);
    }
    win.dsr[newest] = ds;
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (PW(k) >= k) g += DSW(k) * wc[W - 1 - k];
  }
  return g;
#undef XW
#undef DSW
#undef PW
}

// W steps of the backward's walk from step i0 (a multiple of W, so each step's ring slot is a
// constant) inside the tile: each sums dw, and each from step W − 1 on finishes the input gradient
// of the token W − 1 back, into dxs (row i: token t0 + i). kWhole: group_whole passed.
template <typename T, int W, bool kWhole>
__device__ __forceinline__ void backward_group(ConvWindow<W>& win, const float* wc, float* dwc, const T* xs,
                                               const T* dys, T* dxs, int i0, const int* p) {
#pragma unroll
  for (int u = 0; u < W; ++u) {
    const int i = i0 + u;
    win.xr[u] = to_f32(xs[(i + W - 1) * kThreads]);
    const float g =
        backward_step<W>(win, u, wc, dwc, to_f32(dys[i * kThreads]), p[u], kWhole || p[u] >= W - 1, true);
    if (i0 > 0 || u == W - 1) dxs[(i - (W - 1)) * kThreads] = from_f32<T>(g);
  }
}

// The parts of one backward launch (see short_conv_backward_parts), with what the host worked out
// for each: its first channel block (blockIdx.x), and whether its rows of x, dy and dx can be
// moved in 16-byte pieces.
struct BackwardParts {
  const void* dy[kShortConvMaxParts];
  int64_t c0[kShortConvMaxParts], C[kShortConvMaxParts];
  int block0[kShortConvMaxParts + 1];
  bool vec_x[kShortConvMaxParts], vec_dy[kShortConvMaxParts], vec_dx[kShortConvMaxParts];
  int n;
};

template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    short_conv_backward_kernel(T* dx, float* dw, const __grid_constant__ BackwardParts parts, const T* x,
                               const float* w, const int64_t* pos, int64_t R, int64_t T_len, int64_t ld,
                               int64_t ld_dx) {
  constexpr int kTile = backward_tile_of<T>();
  __shared__ __align__(16) T x_s[(kTile + 2 * (W - 1)) * kThreads];
  __shared__ __align__(16) T dy_s[(kTile + W - 1) * kThreads];
  __shared__ int p_s[kTile + W - 1];
  int part = 0;  // blockIdx.x runs over the parts' channel blocks, part after part
  while (part + 1 < parts.n && static_cast<int>(blockIdx.x) >= parts.block0[part + 1]) ++part;
  const int64_t C = parts.C[part];  // the part's channels; the block's first of them, and the thread's:
  const int64_t b0 = (blockIdx.x - parts.block0[part]) * static_cast<int64_t>(kThreads);
  const int64_t cl = b0 + threadIdx.x;
  const int64_t c = parts.c0[part] + cl;  // the thread's channel in x, w, dw and dx
  const T* dy = static_cast<const T*>(parts.dy[part]);
  const int64_t tiles = (T_len + kTile - 1) / kTile, row_tile = row_tile_of(R * tiles);
  if (row_tile < 0) return;
  const int64_t r = row_tile / tiles, t0 = (row_tile % tiles) * kTile;
  const int64_t t1 = min(t0 + kTile, T_len);
  // Token t's pre-activation gradient is needed by dx of tokens t−W+1..t, so the walk runs W−1
  // tokens past the tile (ds = 0 past the row's end); s of those needs x from W−1 tokens back.
  const int64_t t_end = t1 + W - 1;
  const int64_t xa = t0 - (W - 1);  // x_s row 0; dy_s and p_s start at t0
  stage_rows(x_s, x + r * T_len * ld + parts.c0[part], ld, xa, static_cast<int>(t_end - xa), T_len, b0, C,
             parts.vec_x[part]);
  stage_rows(dy_s, dy + r * T_len * C, C, t0, static_cast<int>(t_end - t0), T_len, b0, C, parts.vec_dy[part]);
  stage_positions(p_s, pos ? pos + r * T_len : nullptr, t0, static_cast<int>(t_end - t0), T_len);
  cp_async_wait_all();
  __syncthreads();
  const int n = static_cast<int>(t1 - t0);
  if (cl < C) {
    // Tokens past the row's end were staged as x = dy = 0 (so their ds is 0) and position 0.
    float wc[W], dwc[W];
    ConvWindow<W> win;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      wc[j] = w[c * W + j];
      dwc[j] = 0.f;
      win.dsr[j] = 0.f;
      win.pr[j] = 0;
    }
    const T* xs = x_s + threadIdx.x;    // row i: token xa + i
    const T* dys = dy_s + threadIdx.x;  // row i: token t0 + i
    // Token t0 + i's input gradient, finished W − 1 steps behind the walk, goes into dy_s row i,
    // which step i has read already.
    T* dxs = dy_s + threadIdx.x;
    // Ring slots 1..W−1 hold the W − 1 inputs before the tile's first token (slot 0 takes step 0's).
#pragma unroll
    for (int j = 0; j < W - 1; ++j) win.xr[j + 1] = to_f32(xs[j * kThreads]);
    int i0 = 0;
    for (; i0 + W <= n; i0 += W) {
      int p[W];
      if (group_whole<W>(p_s, i0, p)) backward_group<T, W, true>(win, wc, dwc, xs, dys, dxs, i0, p);
      else backward_group<T, W, false>(win, wc, dwc, xs, dys, dxs, i0, p);
    }
    // The tile's last n % W tokens, then W − 1 steps past it that only finish input gradients.
    const int steps = n + W - 1;
    for (; i0 < steps; i0 += W) {
#pragma unroll
      for (int u = 0; u < W; ++u) {
        const int i = i0 + u;
        if (i >= steps) break;
        win.xr[u] = to_f32(xs[(i + W - 1) * kThreads]);
        const int p = p_s[i];
        const float g = backward_step<W>(win, u, wc, dwc, to_f32(dys[i * kThreads]), p, p >= W - 1, i < n);
        if (i >= W - 1) dxs[(i - (W - 1)) * kThreads] = from_f32<T>(g);
      }
    }
#pragma unroll
    for (int j = 0; j < W; ++j) atomicAdd(dw + c * W + j, dwc[j]);
  }
  __syncthreads();
  store_rows(dx + (r * T_len + t0) * ld_dx + parts.c0[part], dy_s, ld_dx, n, b0, C, parts.vec_dx[part]);
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
  const dim3 grid = row_tiles_grid((C + kThreads - 1) / kThreads, R * ((T_len + tile_of<T>() - 1) / tile_of<T>()));
  short_conv_forward_kernel<T, W><<<grid, kThreads, 0, st>>>(static_cast<T*>(y), static_cast<const T*>(x), w, pos,
                                                             R, T_len, C, ld, rows_vectorizable<T>(x, C, ld),
                                                             rows_vectorizable<T>(y, C, C));
  return static_cast<int>(cudaGetLastError());
}

template <typename T, int W>
int launch_backward(void* dx, float* dw, const ShortConvGradPart* in, int n_parts, const void* x, const float* w,
                    const int64_t* pos, int64_t R, int64_t T_len, int64_t ld, int64_t ld_dx, cudaStream_t st) {
  BackwardParts parts{};
  parts.n = n_parts;
  int64_t blocks = 0;
  for (int i = 0; i < n_parts; ++i) {
    const int64_t c0 = in[i].c0, C = in[i].C;
    parts.dy[i] = in[i].dy;
    parts.c0[i] = c0;
    parts.C[i] = C;
    parts.block0[i] = static_cast<int>(blocks);
    blocks += (C + kThreads - 1) / kThreads;
    parts.vec_x[i] = rows_vectorizable<T>(static_cast<const T*>(x) + c0, C, ld);
    parts.vec_dy[i] = rows_vectorizable<T>(in[i].dy, C, C);
    parts.vec_dx[i] = rows_vectorizable<T>(static_cast<const T*>(dx) + c0, C, ld_dx);
  }
  parts.block0[n_parts] = static_cast<int>(blocks);
  constexpr int kTile = backward_tile_of<T>();
  const dim3 grid = row_tiles_grid(blocks, R * ((T_len + kTile - 1) / kTile));
  short_conv_backward_kernel<T, W><<<grid, kThreads, 0, st>>>(static_cast<T*>(dx), dw, parts, static_cast<const T*>(x),
                                                              w, pos, R, T_len, ld, ld_dx);
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

int short_conv_backward_parts(void* dx, float* dw, const ShortConvGradPart* parts, int n_parts, const void* x, DType dt,
                              const float* w, const int64_t* pos, int64_t R, int64_t T, int64_t ld, int W, void* stream,
                              int64_t ld_dx) {
  if (n_parts < 1 || n_parts > kShortConvMaxParts) return static_cast<int>(cudaErrorInvalidValue);
  int64_t end = 0, width = 0;  // parts side by side in order, within the rows of x and dx
  for (int i = 0; i < n_parts; ++i) {
    const ShortConvGradPart& q = parts[i];
    if (q.c0 < end || q.C < 0 || (q.C > 0 && q.dy == nullptr)) return static_cast<int>(cudaErrorInvalidValue);
    end = q.c0 + q.C;
    width += q.C;
  }
  if (end > ld || end > ld_dx) return static_cast<int>(cudaErrorInvalidValue);
  if (R * T == 0 || width == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
#define DD_BWD(E, K) launch_backward<E, K>(dx, dw, parts, n_parts, x, w, pos, R, T, ld, ld_dx, st)
  switch (dt) {
    case DType::F32: DD_SHORT_CONV_TAPS(float, DD_BWD)
    case DType::BF16: DD_SHORT_CONV_TAPS(__nv_bfloat16, DD_BWD)
    case DType::F16: DD_SHORT_CONV_TAPS(__half, DD_BWD)
  }
#undef DD_BWD
  return static_cast<int>(cudaErrorInvalidValue);
}

int short_conv_backward(void* dx, float* dw, const void* dy, const void* x, DType dt, const float* w,
                        const int64_t* pos, int64_t R, int64_t T, int64_t C, int64_t ld, int W, void* stream,
                        int64_t ld_dx) {
  if (R * T == 0 || C == 0) return 0;
  const ShortConvGradPart part{dy, 0, C};
  return short_conv_backward_parts(dx, dw, &part, 1, x, dt, w, pos, R, T, ld, W, stream, ld_dx == 0 ? C : ld_dx);
}

#undef DD_SHORT_CONV_TAPS

}  // namespace kernels
