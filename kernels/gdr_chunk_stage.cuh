// Staging one chunk of the gated delta rule into shared memory, shared by the fused chunk kernels
// (gdr_chunk_front.cu, gdr_chunk_solve_backward.cu, gdr_chunk_backward_tail.cu): the gates'
// cumulative sum, token-layout rows staged in fp32 (or kept 16-bit) with several loads per thread
// in flight, and the launch.
// Rows past the chunk's length read as zeros (g = β = 0, and zero q, k, v), as in prep.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cp_async.cuh"
#include "kernels/elem.cuh"
#include "kernels/fast_sigmoid.cuh"
#include "kernels/gdr_chunk_io.cuh"
#include "kernels/gdr_chunk_mma.cuh"
#include "kernels/gdr_head_sizes.h"
#include "kernels/tf32_mma.cuh"

namespace kernels {
namespace gdr_chunk_stage {

constexpr int kRows = 64;  // the chunk size C the fused kernels take

// e^(γ_i − γ_j), the decay between two positions of a chunk, in the masks of the front (A, P) and
// of the tail's backward (dS, dPm). kFast (the 16-bit path): ex2.approx of the difference times
// log2 e, two instructions where expf took about eleven; those lines were a quarter of the tail's
// machine code (2.4k of 9.5k instructions) and a seventh of the front's, which both overflow the
// SM's instruction cache (stop 75 found the tail waiting on instruction fetches in 13.6% of its
// stall samples). Its error, a few ulp (about 1e-6 relative at γ_i − γ_j = −10; results below
// 2^-126 flushed to zero), is far below the bf16 rounding the masked values then take; fp32 inputs
// keep expf.
template <bool kFast>
__device__ __forceinline__ float decay_between(float gamma_i, float gamma_j) {
  if constexpr (kFast) {
    return exp2_approx_ftz((gamma_i - gamma_j) * 1.44269504f);
  } else {
    return expf(gamma_i - gamma_j);
  }
}

// The element type an input keeps in shared memory: bf16 and fp16 as they come (their values
// exactly, in half the room), fp32 as fp32.
template <typename T>
using Staged = typename std::conditional<sizeof(T) == 2, T, float>::type;

// The head sizes (dk, dv) the 16-bit training path's kernels are compiled for with both known at
// compile time: hybrid base and small (96, 192), bench gdr (128, 128), moe-1b (128, 256). There
// the kernels' loops over dk and dv unroll with constant bounds and their staging loops divide by
// constants; with the sizes as arguments the state products' kernel spent most of its
// instructions on loop and address arithmetic and was bound by issuing them (docs/perf.md, issue
// 7, stop 53). of(dk_c, dv_c) gets the sizes as integral constants, (0, 0) for any other sizes
// (the kernels then read them from GdrChunkList), also with gdr_fixed_head_sizes off; `kernel`
// names the caller for the launch counter.
template <class Of>
auto with_head_sizes(GdrSizedKernel kernel, int64_t dk, int64_t dv, Of of) {
  using std::integral_constant;
  const bool fixed = gdr_fixed_head_sizes() && ((dk == 96 && dv == 192) || (dk == 128 && (dv == 128 || dv == 256)));
  if (!fixed) return of(integral_constant<int, 0>{}, integral_constant<int, 0>{});
  gdr_count_fixed_head_size_launch(kernel);
  if (dk == 96) return of(integral_constant<int, 96>{}, integral_constant<int, 192>{});
  if (dv == 128) return of(integral_constant<int, 128>{}, integral_constant<int, 128>{});
  return of(integral_constant<int, 128>{}, integral_constant<int, 256>{});
}

// The row pitch, in elements, of staged q or k rows of dk elements of qk_bytes each: fp32 rows
// padded by 4 elements, 16-bit rows by 8 (16 bytes either way), so that for every dk the kernels
// take (a multiple of 16) a fragment's loads fall in 32 different banks.
__host__ __device__ constexpr int qk_pitch(int dk, int qk_bytes) { return dk + (qk_bytes == 4 ? 4 : 8); }

// γ = cumsum(g) into gam_s and β into b_s for the chunk's kRows rows (token t's gate at
// g[t · H + h]): a warp scan on warps 0–1, then warp 0's total carried into warp 1. Every thread
// of the block calls it; it ends with a barrier.
__device__ __forceinline__ void stage_gates(const float* g, const float* beta, int64_t start, int len, int64_t H,
                                            int64_t h, float* gam_s, float* b_s) {
  const int tid = threadIdx.x, lane = tid % 32;
  if (tid < kRows) {
    const bool valid = tid < len;
    float x = valid ? g[(start + tid) * H + h] : 0.f;
    b_s[tid] = valid ? beta[(start + tid) * H + h] : 0.f;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x += y;
    }
    gam_s[tid] = x;
  }
  __syncthreads();
  if (tid >= 32 && tid < kRows) gam_s[tid] += gam_s[31];
  __syncthreads();
}

// A VW-element piece into shared rows of element type D: as loaded when D is the source's type E
// (16-bit rows kept 16-bit), else converted to D through fp32.
template <int VW, typename D, typename E>
__device__ __forceinline__ void store_piece(D* dst, const Vec<E, VW>& x) {
  if constexpr (std::is_same<D, E>::value) {
    x.store(dst);
  } else {
    float f[VW];
#pragma unroll
    for (int j = 0; j < VW; ++j) f[j] = x.get(j);
    gdr_chunk_io::store_n<VW>(dst, f);
  }
}

// Columns [col0, col0 + width) of the chunk's rows of a token-layout tensor (token t's row at
// src + t · token_stride) into dst [kRows][pitch], of element type D (fp32, or E itself). Threads
// first, first + stride, ... take the VW-element pieces, four each loaded before any is stored.
template <int VW, typename E, typename D>
__device__ __forceinline__ void stage_rows(const E* src, int64_t token_stride, int64_t col0, int width, int64_t start,
                                           int len, int first, int stride, D* dst, int pitch) {
  const int w_n = width / VW;
  for (int base = first; base < kRows * w_n; base += 4 * stride) {
    Vec<E, VW> x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int el = base + u * stride, i = el / w_n;
      x[u] = gdr_chunk_mma::load_raw<VW>(src + (start + i) * token_stride + col0 + (el % w_n) * VW,
                                         el < kRows * w_n && i < len);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int el = base + u * stride;
      if (el >= kRows * w_n) continue;
      store_piece<VW>(dst + (el / w_n) * pitch + (el % w_n) * VW, x[u]);
    }
  }
}

// Host side: whether 16-bit token-layout rows at p, token_stride elements apart, can move as
// 16-byte copies (copy_rows_async; their column offsets and widths are multiples of 8 elements).
inline bool rows_copy16(const void* p, int64_t token_stride) {
  return aligned_to(16, p) && token_stride % 8 == 0;
}

// Columns [col0, col0 + width) of the chunk's rows of a 16-bit token-layout tensor (token t's row
// at src + t · token_stride) into dst [kRows][pitch] by 16-byte cp.async, zeros past the chunk's
// length: what stage_rows stores for rows kept 16-bit, but with no thread waiting on a load, so
// that the block's other work runs while the rows come in. Threads first, first + stride, ...
// start the copies; the caller commits, waits and synchronises. col0, width and pitch are
// multiples of 8 elements, src and token_stride as rows_copy16 checks.
template <typename T>
__device__ __forceinline__ void copy_rows_async(const T* src, int64_t token_stride, int64_t col0, int width,
                                                int64_t start, int len, int first, int stride, T* dst, int pitch) {
  static_assert(sizeof(T) == 2, "16-bit rows");
  const int pieces = width / 8;
  for (int e = first; e < kRows * pieces; e += stride) {
    const int i = e / pieces, c = 8 * (e % pieces);
    const bool in_chunk = i < len;
    const T* from = in_chunk ? src + (start + i) * token_stride + col0 + c : src;  // nothing read past the end
    cp_async16_zfill(reinterpret_cast<float*>(dst + i * pitch + c), reinterpret_cast<const float*>(from), in_chunk);
  }
}

// The chunk's q and k rows of head h ([tokens, H, dk], tokens token_stride elements apart) into
// Q_s and K_s [kRows][pitch] of element type D (fp32, or T itself), by all threads of the block,
// four pieces of each per thread in flight at once. Calls also(i, d, q_piece, k_piece) with the
// pieces in fp32, for work on the values as they pass.
template <int VW, typename T, typename D, class Also>
__device__ __forceinline__ void stage_qk(const T* q, const T* k, int64_t token_stride, int64_t h, int dk,
                                         int64_t start, int len, D* Q_s, D* K_s, int pitch, Also also) {
  const int dk_n = dk / VW, stride = blockDim.x;
  for (int base = threadIdx.x; base < kRows * dk_n; base += 4 * stride) {
    Vec<T, VW> qr[4], kr[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int el = base + u * stride, i = el / dk_n;
      const int64_t src = (start + i) * token_stride + h * dk + (el % dk_n) * VW;
      const bool valid = el < kRows * dk_n && i < len;
      qr[u] = gdr_chunk_mma::load_raw<VW>(q + src, valid);
      kr[u] = gdr_chunk_mma::load_raw<VW>(k + src, valid);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int el = base + u * stride, i = el / dk_n, d = (el % dk_n) * VW;
      if (el >= kRows * dk_n) continue;
      float qv[VW], kv[VW];
#pragma unroll
      for (int j = 0; j < VW; ++j) {
        qv[j] = qr[u].get(j);
        kv[j] = kr[u].get(j);
      }
      store_piece<VW>(Q_s + i * pitch + d, qr[u]);
      store_piece<VW>(K_s + i * pitch + d, kr[u]);
      also(i, d, qv, kv);
    }
  }
}

// Host side: launches one of the fused kernels, one block of `threads` per (chunk, head) with
// `smem` bytes of dynamic shared memory, on the instance kernel_of(q|k tag, v tag, row width, TF32
// tag) picks for the inputs' dtypes, vector width and product mode. The TF32 instances (tf32: the
// fp32 operands' products rounded to TF32, one mma each) exist for 16-bit q, k and v of one type,
// how 16-bit training calls these kernels; other inputs keep the split products whatever tf32
// says. (The backward's tail takes the same second instance for its bf16 intermediates.) Returns the cudaError_t (0 = success); cudaErrorInvalidValue for sizes
// gdr_chunk_fused_supports refuses.
template <class KernelOf, class Args>
int launch_fused(const GdrChunkList& l, DType in_qk, DType in_v, bool vec, int threads, size_t smem, void* stream,
                 KernelOf kernel_of, const Args& a, bool tf32 = false) {
  if (!gdr_chunk_fused_supports(l.C, l.dk, l.dv) || l.N * l.H < 1 || l.N * l.H > 2147483647LL) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const unsigned grid = static_cast<unsigned>(l.N * l.H);
  int err = 0;
  gdr_chunk_io::dispatch_two_dtypes(in_qk, in_v, vec, [&](auto qk_tag, auto v_tag, auto width) {
    using QK = decltype(qk_tag);
    auto kernel = kernel_of(qk_tag, v_tag, width, std::false_type{});
    if constexpr (std::is_same<QK, decltype(v_tag)>::value && sizeof(QK) == 2) {
      if (tf32) kernel = kernel_of(qk_tag, v_tag, width, std::true_type{});
    }
    err = static_cast<int>(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    if (err == 0) kernel<<<grid, threads, smem, static_cast<cudaStream_t>(stream)>>>(l, a);
  });
  if (err != 0) return err;
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gdr_chunk_stage
}  // namespace kernels
