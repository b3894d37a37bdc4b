// The 3×TF32 product's block-width rule (kernels::gemm_tf32x3_strips_for): the fewest padded
// output columns, and among those the widest block. Pure host arithmetic, so it runs without a GPU;
// the kernel itself in every width is tested on the GPU (test_bmm_fp32_cuda.cpp).
#include <gtest/gtest.h>

#include "kernels/gemm_tf32x3.h"

TEST(GemmTf32x3Strips, FewestPaddedColumnsThenWidest) {
  // The delta rule's widths: C 64, dk 96 and 128, dv 192 and 256.
  EXPECT_EQ(kernels::gemm_tf32x3_strips_for(64), 2);
  EXPECT_EQ(kernels::gemm_tf32x3_strips_for(96), 3);
  EXPECT_EQ(kernels::gemm_tf32x3_strips_for(128), 4);
  EXPECT_EQ(kernels::gemm_tf32x3_strips_for(160), 5);
  EXPECT_EQ(kernels::gemm_tf32x3_strips_for(192), 6);
  EXPECT_EQ(kernels::gemm_tf32x3_strips_for(256), 4);  // two 128-column blocks, not 192 + a third empty
  // Small and ragged widths: 64-column blocks when nothing wider pads less.
  EXPECT_EQ(kernels::gemm_tf32x3_strips_for(1), 2);
  EXPECT_EQ(kernels::gemm_tf32x3_strips_for(36), 2);
  EXPECT_EQ(kernels::gemm_tf32x3_strips_for(200), 4);   // 256 padded columns: 4 × 64 or 2 × 128 -> 128
  EXPECT_EQ(kernels::gemm_tf32x3_strips_for(4096), 4);  // 4096 = 32 × 128 = 64 × 64, no 192 or 160 fit
  for (int64_t n = 1; n <= 1000; ++n) {
    const int s = kernels::gemm_tf32x3_strips_for(n);
    ASSERT_GE(s, 2);
    ASSERT_LE(s, 6);
    const int64_t padded = (n + 32 * s - 1) / (32 * s) * (32 * s);
    for (int o = 2; o <= 6; ++o) {
      ASSERT_LE(padded, (n + 32 * o - 1) / (32 * o) * (32 * o)) << "N " << n << ": " << s << " strips pad more than " << o;
    }
  }
}
