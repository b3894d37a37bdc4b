// Batched fp32 products on tensor cores with fp32 accuracy ("3×TF32"): each operand element x is
// split into a TF32 part and a TF32 remainder, x = big + small, and a·b is accumulated in fp32 as
// small_a·big_b + big_a·small_b + big_a·big_b. A TF32 × TF32 product is exact in fp32, so what is
// lost is small_a·small_b and the remainders' own TF32 rounding: about 2⁻²¹ relative per product,
// against 2⁻²⁴ for an fp32 SIMT GEMM and 2⁻¹¹ for plain TF32 (measured on K ≤ 260 sums: 2.3e-6 of
// the largest output, against 8e-7 for cuBLAS fp32). The gated delta rule's core is fp32 by spec
// (MODEL.md §0, test 18's 1e-5), and its batched chunk products ran as cuBLAS fp32 SIMT GEMMs.
// Three tensor-core passes cost less than one SIMT pass, which leaves these small products bound
// by their fp32 memory traffic (docs/perf.md has the measurements).
// Raw pointers, no torch; the reference is an fp32 (or fp64) GEMM (model/bmm_fp32.h).
#pragma once

#include <cstdint>

namespace kernels {

// One operand as the product reads it: element (r, c) of batch i is at ptr[i·batch + r·row + c·col].
// One of row/col must be 1 (the contiguous dimension). Elements are fp32, or bf16 (bf16 = true:
// raw bit patterns, widened to fp32 exactly). Beside a bf16 operand the fp32 one is rounded to
// TF32 and each product is one mma: about 2⁻¹¹ relative error, below the 2⁻⁹ of the bf16
// operand's own rounding; two bf16 operands multiply exactly (fp32 accumulation only). The delta
// rule keeps its chunk intermediates in bf16 under 16-bit training (model/gdr_scan.h,
// model/gdr_chunk_core.h).
struct GemmOperand {
  const void* ptr = nullptr;
  int64_t batch = 0;  // elements between batch items (0: the same matrix for every item)
  int64_t row = 0;    // elements between rows
  int64_t col = 0;    // elements between columns
  bool bf16 = false;
  // When set (device memory, int32): the operand's rows are gathered. Row r of item i (r along M for
  // a, along K for b) is row rows[i · extent + r] of ptr (extent M, or K), and zeros where that entry
  // is negative; batch is 0. The caller guarantees every entry is below ptr's row count (nothing
  // checks it on the device). Taken for a K-contiguous a and an N-contiguous b of the first pair, and
  // for b only up to kGemmMappedRowsMax rows of K. The delta rule's backward reads its output
  // gradient in token order this way (no copy into chunk rows).
  const int32_t* rows = nullptr;
};

// The most K rows a gathered b may have (the block reads b's whole map into shared memory once).
constexpr int64_t kGemmMappedRowsMax = 128;

// out[i] = alpha · (a[i] b[i] + a2[i] b2[i]) + beta · out[i]: a [M, K], b [K, N], out [M, N] (fp32,
// or bf16 with out_bf16) with unit column stride; the second pair a2 [M, K2], b2 [K2, N] only when
// K2 > 0 (one pass over out instead of a second product adding to it: the delta rule's
// O = s (P Vn + Qg h_in)). beta = 0
// never reads out (it may be uninitialised). Either or both of a and b may be bf16; a bf16 b needs a
// K-contiguous a (a.col == 1).
struct GemmTf32x3Args {
  int64_t batch = 0, M = 0, N = 0, K = 0;
  GemmOperand a, b;
  int64_t K2 = 0;
  GemmOperand a2, b2;  // laid out and typed as a and b are (a2.col == 1 exactly when a.col == 1; likewise b2)
  void* out = nullptr;
  // out holds bf16 (the fp32 sums rounded once, to nearest even) instead of fp32: beta 0, and even
  // strides and a 4-byte aligned out (column pairs are stored as one word).
  // The delta rule's output under 16-bit training: its only readers, the output norm forward and
  // backward, then read half the bytes (model/gdr_chunk_core.h).
  bool out_bf16 = false;
  int64_t out_batch = 0, out_row = 0;
  // When set (device memory, [batch · M]): row m of item i is written to out + out_rows[i·M + m] ·
  // out_row instead, and not at all where the entry is negative; out_batch is unused. The delta
  // rule's output goes from chunk rows straight to token order this way.
  const int32_t* out_rows = nullptr;
  float alpha = 1.0f, beta = 0.0f;
  // 32-column warp strips per block, 2 to 6 (block tiles 64 × 64 to 64 × 192); 0: gemm_tf32x3_strips_for(N).
  int n_strips = 0;
  // Two bf16 operands are multiplied by bf16 m16n8k16 mma on ldmatrix fragments (default), or by
  // TF32 m16n8k8 mma on the widened values (false; for before/after measurements). The products
  // are exact either way and summed in fp32: only the order of the sums differs.
  bool bf16_mma = true;
};

// The block width for N output columns: the fewest padded columns ceil(N / (32 s)) · 32 s over
// s = 2..6, and among those the widest block (each block reads its slice of A once, and these
// products are bound by L2 traffic): N 64 → 2, 96 → 3, 128 → 4, 160 → 5, 192 → 6, 256 → 4.
inline int gemm_tf32x3_strips_for(int64_t N) {
  int best = 2;
  int64_t best_cols = (N + 63) / 64 * 64;
  for (int s = 3; s <= 6; ++s) {
    const int64_t cols = (N + 32 * s - 1) / (32 * s) * (32 * s);
    if (cols <= best_cols) {
      best = s;
      best_cols = cols;
    }
  }
  return best;
}

// Whether the kernel takes these operands: each one has a unit-stride dimension whose extent is a
// multiple of 16 bytes' elements (4 fp32, 8 bf16), its other strides and its pointer are 16-byte
// aligned, and the batch fits a grid; A and B may be bf16, B only beside a K-contiguous A; row
// maps as GemmOperand::rows says.
// Otherwise use the reference.
inline bool gemm_tf32x3_supports(const GemmTf32x3Args& args) {
  auto operand_ok = [](const GemmOperand& o, int64_t rows, int64_t cols) {
    const int64_t v = o.bf16 ? 8 : 4;  // elements in 16 bytes
    if (reinterpret_cast<uintptr_t>(o.ptr) % 16 != 0 || o.batch % v != 0) return false;
    if (o.col == 1) return cols % v == 0 && o.row % v == 0;
    if (o.row == 1) return rows % v == 0 && o.col % v == 0;
    return false;
  };
  const bool types_ok = !args.b.bf16 || args.a.col == 1;
  const bool maps_ok = (args.a.rows == nullptr || (args.a.col == 1 && args.a.batch == 0)) &&
                       (args.b.rows == nullptr || (args.b.col == 1 && args.b.batch == 0 && args.K <= kGemmMappedRowsMax)) &&
                       args.a2.rows == nullptr && args.b2.rows == nullptr;
  const bool second_ok = args.K2 == 0 || (args.K2 > 0 && operand_ok(args.a2, args.M, args.K2) &&
                                           operand_ok(args.b2, args.K2, args.N) && (args.a2.col == 1) == (args.a.col == 1) &&
                                           (args.b2.col == 1) == (args.b.col == 1) && args.a2.bf16 == args.a.bf16 &&
                                           args.b2.bf16 == args.b.bf16);
  return args.batch >= 1 && args.batch < (int64_t{1} << 31) && args.M >= 1 && args.N >= 1 && args.K >= 1 &&
         args.M < (int64_t{1} << 20) && args.N < (int64_t{1} << 20) && operand_ok(args.a, args.M, args.K) &&
         operand_ok(args.b, args.K, args.N) && types_ok && maps_ok && second_ok && args.out != nullptr &&
         (!args.out_bf16 || (args.beta == 0.0f && args.out_row % 2 == 0 && args.out_batch % 2 == 0 &&
                             reinterpret_cast<uintptr_t>(args.out) % 4 == 0));
}

#ifdef DD_HAVE_CUDA
// Launches on `stream` (a cudaStream_t). Returns the cudaError_t of the launch (0 = success).
int gemm_tf32x3(const GemmTf32x3Args& args, void* stream);
#endif

}  // namespace kernels
