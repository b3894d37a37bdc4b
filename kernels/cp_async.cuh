// Asynchronous copies from global to shared memory (sm80+) for the kernels that stage whole tiles
// or rows: start every copy, then one wait, then a __syncthreads to make every thread's copies
// visible to the block; or, in a pipeline, groups of copies waited for one at a time.
#pragma once

#include <cuda_runtime.h>

namespace kernels {

// src and smem_dst aligned to 16 bytes.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// A copy of 4, 8 or 16 bytes, src and smem_dst aligned to it (16: past L1, as cp_async16; the smaller
// sizes may only go through L1).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem_dst, const void* src) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (kBytes == 16) {
    cp_async16(smem_dst, src);
  } else {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src), "n"(kBytes));
  }
}

// Waits for all of this thread's copies.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Copies in groups: commit closes the group of this thread's copies started since the last commit;
// wait<N> returns once at most the N newest groups are still in flight.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace kernels
