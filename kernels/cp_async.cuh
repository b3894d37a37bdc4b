// Asynchronous 16-byte copies from global to shared memory (sm80+) for the kernels that stage
// whole tiles or rows: start every copy, then one wait, then a __syncthreads to make every
// thread's copies visible to the block.
#pragma once

#include <cuda_runtime.h>

namespace kernels {

// src and smem_dst aligned to 16 bytes.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// Waits for all of this thread's copies.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace kernels
