// The state scan's block-width rule (kernels::gdr_scan_mma_width_for) on the shapes whose timings
// set it (docs/perf.md, issue 7, stop 23: one H100, 132 SMs, every width measured): the rule must
// pick the width that was fastest there, and none where no tensor-core width takes the sizes.
// Pure host arithmetic, so it runs without a GPU.
#include <gtest/gtest.h>

#include "kernels/gdr_scan.h"

namespace {

constexpr int kH100Sms = 132;

TEST(GdrScanWidth, PicksTheWidthMeasuredFastest) {
  // bench gdr's shape: 8 documents × 16 heads, dk = dv = 128. 64 (256 blocks, two on each SM)
  // measured 0.65 ms, 32 0.69, 128 0.64 with a slower backward, 96 0.91.
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 128, 128, 8 * 16, kH100Sms), 64);
  // hybrid base, 8 documents × 6 heads, dk 96, dv 192: 96 columns, one block per SM.
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 96, 192, 8 * 6, kH100Sms), 96);
  // the same with 16 documents: 32 columns (576 blocks, at most 5 per SM).
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 96, 192, 16 * 6, kH100Sms), 32);
  // moe-1b, 8 documents × 6 heads, dk 128, dv 256: 32 columns (384 blocks, at most 3 per SM).
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 128, 256, 8 * 6, kH100Sms), 32);
}

// With bf16 inputs (the bf16-training path) ties go to 128 columns first (stop 31: on bench gdr's
// shape 128 took 1.01 ms forward queued against 1.10 for 64 and 1.08 for 32, and less forward +
// backward); where one width spreads the blocks best it still wins.
TEST(GdrScanWidth, Bf16InputsPreferTheWidestOfTiedWidths) {
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 128, 128, 8 * 16, kH100Sms, true), 128);
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 96, 192, 8 * 6, kH100Sms, true), 96);
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 96, 192, 16 * 6, kH100Sms, true), 32);
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 128, 256, 8 * 6, kH100Sms, true), 32);
  // 128 columns only where the 32-warp block takes the sizes (C ≤ 64, dk ≤ 128).
  const int w = kernels::gdr_scan_mma_width_for(64, 256, 128, 8 * 16, kH100Sms, true);
  EXPECT_TRUE(w == 32 || w == 64) << w;
}

TEST(GdrScanWidth, OnlyWidthsThatTakeTheSizes) {
  // C 128 and dk 256 are too large for the 24- and 32-warp blocks: 32 or 64 columns only.
  for (const int64_t doc_heads : {1, 7, 48, 130, 1000}) {
    const int w_c = kernels::gdr_scan_mma_width_for(128, 64, 128, doc_heads, kH100Sms);
    const int w_dk = kernels::gdr_scan_mma_width_for(64, 256, 128, doc_heads, kH100Sms);
    EXPECT_TRUE(w_c == 32 || w_c == 64) << doc_heads << " pairs, C 128: " << w_c;
    EXPECT_TRUE(w_dk == 32 || w_dk == 64) << doc_heads << " pairs, dk 256: " << w_dk;
  }
  // No tensor-core width: C not a multiple of 16, dk not a multiple of 16, dv not of 4.
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(40, 64, 64, 8, kH100Sms), 0);
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 36, 64, 8, kH100Sms), 0);
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 64, 30, 8, kH100Sms), 0);
  // No device or no work: none.
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 64, 64, 8, 0), 0);
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 64, 64, 0, kH100Sms), 0);
  // One pair on a big GPU: every block gets an SM of its own, so the narrowest blocks win.
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 64, 64, 1, kH100Sms), 32);
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 64, 256, 1, kH100Sms), 32);
  // Blocks that fill the SMs evenly in every width: the tie goes to 64 (264 pairs of dv 64 are
  // 264 blocks of 64, two per SM, or 528 of 32, four per SM).
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 64, 64, 264, kH100Sms), 64);
}

}  // namespace

// The width is picked for the documents' worth of full-length scans (GdrScanArgs::busy_docs), not
// for every document: packed rows of a few long documents and many short pieces (and a fixed
// layout's empty documents) took widths too narrow (stop 41: hybrid base's scans 4.09 ms a step
// at the 32 and 64 columns picked for 12 – 16 documents, 3.37 ms at 96).
TEST(GdrScanWidth, PicksForTheBusyDocuments) {
  kernels::GdrScanArgs a;
  a.n_docs = 16;
  a.H = 6;
  EXPECT_EQ(kernels::gdr_scan_width_doc_heads(a), 96) << "busy_docs unset: every document";
  a.busy_docs = 9;
  EXPECT_EQ(kernels::gdr_scan_width_doc_heads(a), 54);
  EXPECT_EQ(kernels::gdr_scan_mma_width_for(64, 96, 192, kernels::gdr_scan_width_doc_heads(a), kH100Sms, true), 96);
  a.busy_docs = 40;  // never more than the documents there are
  EXPECT_EQ(kernels::gdr_scan_width_doc_heads(a), 96);
}
