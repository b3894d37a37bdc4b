// Device helpers shared by the training kernels: fp32 loads and stores of fp32/bf16/fp16
// elements, block-wide sums, and the dispatch from a runtime DType to a template parameter.
// Every kernel computes in fp32 whatever it reads or writes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/dtype.h"

namespace kernels {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half(v); }

// Sum over the block; every thread gets the result. `scratch` holds 32 floats; blockDim.x is a
// multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int n_warps = (blockDim.x + 31) / 32;
  v = lane < n_warps ? scratch[lane] : 0.f;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Calls f(T{}) with T the CUDA element type of `dt`.
template <typename F>
inline void dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: f(float{}); break;
    case DType::BF16: f(__nv_bfloat16{}); break;
    case DType::F16: f(__half{}); break;
  }
}

}  // namespace kernels
