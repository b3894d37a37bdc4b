// Device helpers of the split-TF32 tensor-core kernels (gemm_tf32x3.cu, gdr_scan_mma.cu,
// gdr_chunk_front.cu): asynchronous 16-byte copies into shared memory, the split of an fp32 value
// into two TF32 parts, one m16n8k8 TF32 mma.sync, and the three products of two split fragments.
// Each fp32 operand x = big + small; a product of two split operands is taken as big·big +
// big·small + small·big (about 2⁻²¹ relative error, where plain TF32 has 2⁻¹¹).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cp_async.cuh"

namespace kernels {

__device__ __forceinline__ void cp_async16_zfill(float* smem_dst, const float* src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

// x = big + small, both TF32 (fp32 bit patterns with the low 13 mantissa bits zero).
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(big) : "f"(x));
  const float rest = x - __uint_as_float(big);
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(small) : "f"(rest));
}

// x rounded to the nearest TF32 value (ties away from zero).
__device__ __forceinline__ uint32_t round_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// kSplit: x = big + small as split_tf32. Otherwise big is x rounded to TF32 and small is left
// unset: the single-product mode (mma_products<false>) never reads it.
template <bool kSplit>
__device__ __forceinline__ void to_tf32(float x, uint32_t& big, uint32_t& small) {
  if constexpr (kSplit) {
    split_tf32(x, big, small);
  } else {
    big = round_tf32(x);
  }
}

// d += a b for one 16 × 8 × 8 tile (PTX fragment layouts: a row-major, b column-major).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One operand fragment split in two TF32 parts.
struct FragA {
  uint32_t big[4], small[4];
};
struct FragB {
  uint32_t big[2], small[2];
};

// The three products of a split pair. Big·big goes to its own accumulator: two shorter dependency
// chains instead of one, and the small cross terms are summed apart from the large one.
__device__ __forceinline__ void mma3(float (&d_big)[4], float (&d_cross)[4], const FragA& a, const FragB& b) {
  mma_tf32(d_big, a.big, b.big);
  mma_tf32(d_cross, a.big, b.small);
  mma_tf32(d_cross, a.small, b.big);
}

// kSplit: mma3's three products (about 2⁻²¹ relative error). Otherwise the one product of the
// TF32 values (about 2⁻¹¹, as cuBLAS with TF32 allowed), a third of the tensor-core work.
template <bool kSplit>
__device__ __forceinline__ void mma_products(float (&d_big)[4], float (&d_cross)[4], const FragA& a, const FragB& b) {
  if constexpr (kSplit) {
    mma3(d_big, d_cross, a, b);
  } else {
    mma_tf32(d_big, a.big, b.big);
  }
}

}  // namespace kernels
