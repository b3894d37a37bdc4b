// Shared-memory barriers (mbarrier; the parity wait needs sm_90) for
// a ring of buffers that some warps fill and others read, with no __syncthreads: a "full" barrier
// per buffer, which the copying threads arrive on once their cp.async copies into it have landed
// (arrive_on_copies) and the readers wait for; and an "empty" one, which each reader arrives on
// once done with the buffer and the copying threads wait for before refilling it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kernels::mbar {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread initialises a barrier for `count` arrivals a phase; the block must then sync before
// anyone uses it.
__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// One of the phase's arrivals.
__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Waits until the barrier's phase of parity `parity` (0 for its first, 1 for its second, ...) has
// completed; what was written before its arrivals (and the copies they counted) is then visible.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}

// An arrival on `bar` once every cp.async this thread has started so far has landed (its count of
// arrivals a phase includes it: noinc).
__device__ __forceinline__ void arrive_on_copies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

}  // namespace kernels::mbar
