// The sequential part of the chunked gated delta rule (model/gdr.cpp, MODEL.md §4): the scan of
// the state over chunk index, forward and backward, as one kernel launch instead of a few ATen
// launches per chunk (the hybrid was launch-bound there). Raw fp32 pointers (the forward's
// per-step outputs optionally bf16), no torch.
//
// Both directions have the same shape, so one kernel does both ("linear scan"):
//   for each step of a document's chunk list (forward order, or reverse):
//     out_state[r] = S
//     y            = A[r] + sign_p · P[r] S             [C, dv]   (P [C, dk], S [dk, dv])
//     out_y[r]     = y
//     S            = decay[r] · S + sign_q · Q[r]ᵀ y + E[r]
//   final[doc] = S
// Forward:  A = U,   P = W,  Q = Kd, sign_p = −1, sign_q = +1, no E; S = h, y = the new values.
// Backward: A = dVn, P = Kd, Q = W,  sign_p = +1, sign_q = −1, E = dHin; S = dh, y = dU, reverse.
//
// Layout: r = chunk · H + head indexes the chunk list; the chunk of sorted document s at scan step
// m is step_off[m] + s, for m < n_chunks[s] (model/gdr.cpp's step-major plan). init and final are
// [n_docs · H, dk, dv] in sorted document order. Columns of S evolve independently, so blocks
// split dv; dk must be a multiple of 4 and at most 256, the chunk at most 128 (176 KiB of shared
// memory at both limits).
// The reference is model/gdr_scan.h's gdr_scan_reference (ATen, the same loop).
#pragma once

#include <cstdint>

namespace kernels {

enum GdrScanVariant : int {
  kGdrScanSimt8 = 0,
  kGdrScanSimt16 = 1,
  kGdrScanTensorCores32 = 2,
  kGdrScanTensorCores64 = 3,
  kGdrScanAuto = 4,
  kGdrScanTensorCores96 = 5,
  kGdrScanTensorCores128 = 6,
};

struct GdrScanArgs {
  const float* A = nullptr;      // [R, C, dv]
  const float* P = nullptr;      // [R, C, dk]
  const float* Q = nullptr;      // [R, C, dk]
  const float* decay = nullptr;  // [R]
  const float* E = nullptr;      // [R, dk, dv] or null (zero)
  const float* init = nullptr;   // [n_docs·H, dk, dv] or null (zero)
  float* out_state = nullptr;    // [R, dk, dv]
  float* out_y = nullptr;        // [R, C, dv]
  float* final_state = nullptr;  // [n_docs·H, dk, dv]
  // Instead of out_state and out_y, the same values rounded to bf16 (raw bits, round to nearest
  // even), half the bytes written here and read by the products after the scan: only the forward
  // (no E) with tf32x3 off, on the tensor-core kernel (gdr_scan_tensor_core_width > 0); the state
  // itself stays fp32, and so does final_state.
  uint16_t* out_state_bf16 = nullptr;  // [R, dk, dv]
  uint16_t* out_y_bf16 = nullptr;      // [R, C, dv]
  // bf16 inputs (raw bits), on the tensor-core kernel with tf32x3 off only: P_bf16 and Q_bf16
  // instead of P and Q, staged as bf16 (half the bytes through L2 and shared memory) and widened
  // exactly, a bf16 value being a TF32 one. Two forms (gdr_scan_bf16_inputs_ok): the forward (no
  // E) also reads A_bf16 instead of A and writes bf16 outputs; the backward (with E) reads A and E
  // in fp32 and writes fp32. Results equal those of fp32 inputs holding the same values, bit for bit
  // (in the forward with bf16_products off: with it on, the products are bf16 mma).
  const uint16_t* A_bf16 = nullptr;  // [R, C, dv]
  const uint16_t* P_bf16 = nullptr;  // [R, C, dk]
  const uint16_t* Q_bf16 = nullptr;  // [R, C, dk]
  // The backward with the output's gradient products inside (the "fused" form; bf16 P and Q, TF32
  // products, no A and no E): with the chunk output O = s (Qg h_in + Pm Vn) [C, dv],
  // the scan reads dO and takes each chunk's A = dVn = s Pmᵀ dO and E = dHin = s Qgᵀ dO itself, on
  // tensor cores (dO rounded to TF32, Pm and Qg widened exactly), instead of reading them in fp32
  // from two products run before it: fp32 dO and bf16 Pm and Qg read here instead of fp32 dVn and
  // E, and those products' launches, writes and reads of dO gone (docs/perf.md, issue 7, stop 36).
  // This form writes out_state_bf16 (the running state stays fp32, and so does final_state): half
  // the bytes for the state gradient here and for its two readers after; and y in fp32 (out_y) or
  // rounded to bf16 (out_y_bf16).
  const float* dO = nullptr;            // [rows, dv]: the output's gradient
  // Or the output's gradient in bf16 (the 16-bit path's, model/gdr_chunk_core.h), for the form with
  // bf16 products only (which rounds dO to bf16 for them anyway: the same results as an fp32 dO
  // holding these values, bit for bit): staged straight into its operand tile, with no fp32 copy in
  // shared memory and no rounding pass a step. dv a multiple of 8 and y in bf16 (out_y_bf16); set
  // dO or dO_bf16, not both.
  const uint16_t* dO_bf16 = nullptr;    // [rows, dv]
  const int32_t* dO_rows = nullptr;     // [R·C]: the dO row of chunk row r·C + i, −1 for zeros; null: r·C + i
  const uint16_t* Pm_bf16 = nullptr;    // [R, C, C]: the masked Q Kᵀ of the output (zero above the diagonal)
  const uint16_t* Qg_bf16 = nullptr;    // [R, C, dk]: the gated queries
  float out_scale = 1.f;                // s
  // The forward's bf16 form on the warp-column kernel (gdr_scan_forward_output_width) may also take
  // the chunk output O = out_scale · (P_o out_y + Qg_o out_state) [C, dv] of each chunk row, from
  // the same bf16 y and state its products take, rounded once to bf16: the output product in the
  // scan (docs/perf.md, issue 7, stop 56). P_o [R, C, C] is zero above its diagonal. gdr_scan fails
  // for these pointers where that kernel does not run.
  const uint16_t* o_P_bf16 = nullptr;   // [R, C, C]
  const uint16_t* o_Qg_bf16 = nullptr;  // [R, C, dk]
  uint16_t* out_o_bf16 = nullptr;       // [R, C, dv]
  // The fused form's four products as bf16 mma (kernels/gdr_scan_bf16.cu) instead of TF32: dO, the
  // running state and y rounded to bf16 as operands (2⁻⁹ relative where TF32 has 2⁻¹¹), sums and
  // the running state in fp32. Taken where gdr_scan_fused_bf16_width is not 0. In the forward's
  // bf16 form (gdr_scan_forward_bf16_form_ok) the same for its two products, P S and Qᵀ y: the
  // state and y rounded to bf16 as operands, which is what the bf16 outputs already hold; taken
  // where gdr_scan_forward_bf16_width is not 0.
  bool bf16_products = false;
  const int32_t* step_off = nullptr;  // [n_steps], device memory
  const int32_t* n_chunks = nullptr;  // [n_docs], device memory
  float sign_p = -1.f, sign_q = 1.f;
  bool reverse = false;
  // Which kernel runs the scan (docs/perf.md has the comparisons):
  //   kAuto (default): the tensor-core kernel in the block width gdr_scan_mma_width picks for
  //                    these sizes and this GPU, else kSimt16;
  //   kTensorCores32: split-TF32 mma.sync products (gdr_scan_mma.cu), 8-warp blocks of 32 state
  //                   columns, for the sizes gdr_scan_mma_supports takes (else kSimt16);
  //   kTensorCores64, 96, 128: the same with 16-, 24- and 32-warp blocks of 64, 96 and 128
  //                   columns (else kSimt16);
  //   kSimt16: fp32 FMA, blocks of 16 warps; kSimt8: the same with 8 warps (kept for the tests).
  int variant = kGdrScanAuto;
  // The tensor-core variants' products: true, split TF32 (three mma per product, about 2⁻²¹
  // relative error, close to fp32); false, the operands rounded to TF32 and one mma (about 2⁻¹¹,
  // as cuBLAS with TF32 allowed). The FMA variants compute in fp32 either way.
  bool tf32x3 = true;
  int64_t n_docs = 0, H = 0, C = 0, dk = 0, dv = 0;
  // The documents' worth of full-length scans, Σ chunks / steps rounded up (at most n_docs), that
  // the automatic block width is picked for (gdr_scan_width_doc_heads); 0: n_docs. A document
  // shorter than the longest frees its SM early, and a fixed layout's empty documents cost
  // nothing, so counting every document as a full scan picked widths too narrow for packed rows of
  // a few long documents (hybrid base's scans: 4.09 ms a step at 32 and 64 columns, 3.37 ms at
  // 96; docs/perf.md, stop 41).
  int64_t busy_docs = 0;
};

// The (document, head) pairs the automatic block width is picked for: busy_docs (where set and
// below n_docs) or n_docs, times H.
inline int64_t gdr_scan_width_doc_heads(const GdrScanArgs& a) {
  return (a.busy_docs > 0 && a.busy_docs < a.n_docs ? a.busy_docs : a.n_docs) * a.H;
}

// Shared memory of one block (the FMA kernels): the state and y columns, and one staged [C, dk] tile.
inline int64_t gdr_scan_smem_bytes(int64_t C, int64_t dk) { return (32 * (dk + C) + C * dk) * 4; }

// True when the kernel takes these sizes (otherwise use the reference).
inline bool gdr_scan_supports(int64_t C, int64_t dk) { return C >= 1 && C <= 128 && dk >= 4 && dk <= 256 && dk % 4 == 0; }

// The tensor-core variants, blocks of `cols` state columns (32, 64, 96 or 128): shared memory of
// one block (the state and y's two parts [·][cols + 8], P and Q [C][dk + pad], fp32 or with
// bf16_in bf16), its limit, and the sizes they take (16-row mma tiles over C and dk, 16-byte
// copies of columns). The 24- and 32-warp blocks (96 and 128 columns) have 80 and 64 registers a
// thread, which fit one 16-row tile of y and of the state per warp without spilling: C ≤ 64 and
// dk ≤ 128. bf16 inputs take less shared memory than fp32 ones, so the sizes are the same for both.
constexpr int64_t kGdrScanMmaMaxSmem = 227 * 1024;
inline int64_t gdr_scan_mma_smem_bytes(int64_t C, int64_t dk, int64_t cols = 32, bool bf16_in = false) {
  const int64_t pq = bf16_in ? 2 * C * (dk + 8) * 2 : C * (2 * dk + 12) * 4;
  return (cols + 8) * (dk + 2 * C) * 4 + pq;
}
inline bool gdr_scan_mma_supports(int64_t C, int64_t dk, int64_t dv, int64_t cols = 32) {
  return C >= 16 && C <= 128 && C % 16 == 0 && dk >= 16 && dk <= 256 && dk % 16 == 0 && dv >= 4 && dv % 4 == 0 &&
         (cols <= 64 || (C <= 64 && dk <= 128)) && gdr_scan_mma_smem_bytes(C, dk, cols) <= kGdrScanMmaMaxSmem;
}

// The fused backward form's shared memory (GdrScanArgs::dO) in blocks of `cols` columns: the state
// and y's TF32 part [·][cols + 8] fp32 (no small part: TF32 products), P, Q and Qg [C][dk + 8] and
// Pm [C][C + 8] bf16, and dO [C][cols + 8] fp32.
inline int64_t gdr_scan_fused_smem_bytes(int64_t C, int64_t dk, int64_t cols) {
  return (cols + 8) * (dk + C) * 4 + 3 * C * (dk + 8) * 2 + C * (C + 8) * 2 + C * (cols + 8) * 4;
}

// The fused form with bf16 products (GdrScanArgs::bf16_products): shared memory of a block of
// `cols` columns (S, y and dO rounded [·][cols + 8] and Kd, W, Qg [C][dk + 8], Pm [C][C + 8], all
// bf16; dO as staged, fp32 [C][cols + 4]), and the sizes it takes: one 16-row tile of y and one of
// the state per warp (C ≤ 64, dk ≤ 128), 16-element k-steps.
// With dO_bf16 (GdrScanArgs::dO_bf16) there is no fp32 copy of dO.
constexpr int64_t gdr_scan_fused_bf16_smem_bytes(int64_t C, int64_t dk, int64_t cols, bool dO_bf16 = false) {
  return ((dk + 2 * C) * (cols + 8) + 3 * C * (dk + 8) + C * (C + 8)) * 2 + (dO_bf16 ? 0 : C * (cols + 4) * 4);
}
// Both bf16 forms index within a chunk row's tiles in 32 bits (offsets up to dk · dv): dv below
// 2³¹ / 128 keeps them exact (head sizes are far smaller).
constexpr int64_t kGdrScanBf16MaxDv = (int64_t{1} << 31) / 128 - 1;
inline bool gdr_scan_fused_bf16_supports(int64_t C, int64_t dk, int64_t dv, int64_t cols) {
  return C >= 16 && C <= 64 && C % 16 == 0 && dk >= 16 && dk <= 128 && dk % 16 == 0 && dv >= 4 && dv % 4 == 0 &&
         dv <= kGdrScanBf16MaxDv &&
         (cols == 32 || cols == 64 || cols == 96 || cols == 128) &&
         gdr_scan_fused_bf16_smem_bytes(C, dk, cols) <= kGdrScanMmaMaxSmem;
}

// The forward form with bf16 products: shared memory of a block of `cols` columns (S and y rounded
// [·][cols + 8], W and Kd [C][dk + 8], all bf16), and the sizes it takes (those of the fused form).
constexpr int64_t gdr_scan_forward_bf16_smem_bytes(int64_t C, int64_t dk, int64_t cols) {
  return ((dk + C) * (cols + 8) + 2 * C * (dk + 8)) * 2;
}
inline bool gdr_scan_forward_bf16_supports(int64_t C, int64_t dk, int64_t dv, int64_t cols) {
  return C >= 16 && C <= 64 && C % 16 == 0 && dk >= 16 && dk <= 128 && dk % 16 == 0 && dv >= 4 && dv % 4 == 0 &&
         dv <= kGdrScanBf16MaxDv &&
         (cols == 32 || cols == 64 || cols == 96 || cols == 128) &&
         gdr_scan_forward_bf16_smem_bytes(C, dk, cols) <= kGdrScanMmaMaxSmem;
}

// The block width the default takes (0: no tensor-core width takes these sizes), for `doc_heads`
// (document, head) pairs on a GPU of `sms` SMs. Measured on an H100 (docs/perf.md), the scan is
// bound by each SM's throughput more than by a step's latency: one 64-column block alone on an SM
// and two 32-column blocks sharing one take about the same time per step, a 128-column block about
// twice that. So the time follows the columns the busiest SM scans, ceil(blocks / SMs) · width,
// and the width that spreads the blocks best wins: for hybrid `base`'s 48 pairs of dv 192, 96
// columns (96 blocks, one per SM) against 64 (144 blocks, two on some SMs). Ties go to 64 columns,
// then 96, 32, 128: narrower blocks stage P and Q once per 32 columns, and the 32-warp block
// spills registers in the backward. With bf16 inputs (bf16_in: P and Q staged in half the bytes)
// ties go to 128 first, then 64, 96, 32: there the 128-column block took 9% less time than 64
// on bench gdr's shape, forward and backward (issue 7, stop 31). The fused backward form (`fused`,
// GdrScanArgs::dO, bf16 inputs) takes only the widths whose shared memory fits it.
inline int gdr_scan_mma_width_for(int64_t C, int64_t dk, int64_t dv, int64_t doc_heads, int sms, bool bf16_in = false,
                                  bool fused = false) {
  if (sms < 1 || doc_heads < 1) return 0;
  static constexpr int kFp32Order[] = {64, 96, 32, 128}, kBf16Order[] = {128, 64, 96, 32};
  int best = 0;
  int64_t best_load = 0;
  for (const int cols : bf16_in || fused ? kBf16Order : kFp32Order) {
    if (!gdr_scan_mma_supports(C, dk, dv, cols)) continue;
    if (fused && gdr_scan_fused_smem_bytes(C, dk, cols) > kGdrScanMmaMaxSmem) continue;
    const int64_t blocks = doc_heads * ((dv + cols - 1) / cols);
    const int64_t load = (blocks + sms - 1) / sms * cols;
    if (best == 0 || load < best_load) {
      best = cols;
      best_load = load;
    }
  }
  return best;
}

// Whether a reads the output's gradient (GdrScanArgs::dO or dO_bf16): the fused backward form.
inline bool gdr_scan_reads_output_grad(const GdrScanArgs& a) { return a.dO != nullptr || a.dO_bf16 != nullptr; }

// Whether a's pointers are the fused backward form's (GdrScanArgs::dO): dO (or dO_bf16, with bf16
// products, bf16 out_y and dv a multiple of 8), Pm, Qg, bf16 P and Q, a bf16 out_state and one
// out_y (fp32 or bf16), neither A nor E, TF32 products, and the backward's sign_p of +1.
inline bool gdr_scan_fused_form_ok(const GdrScanArgs& a) {
  const bool dO_ok = a.dO_bf16 == nullptr ? a.dO != nullptr
                                           : a.dO == nullptr && a.bf16_products && a.dv % 8 == 0 && a.out_y_bf16 != nullptr;
  return dO_ok && a.Pm_bf16 != nullptr && a.Qg_bf16 != nullptr && a.P_bf16 != nullptr &&
         a.Q_bf16 != nullptr && a.P == nullptr && a.Q == nullptr && a.A == nullptr && a.A_bf16 == nullptr &&
         a.E == nullptr && a.out_state == nullptr && (a.out_y != nullptr) != (a.out_y_bf16 != nullptr) &&
         a.out_state_bf16 != nullptr && !a.tf32x3 && a.sign_p == 1.f;
}

// The pointers of one of the two bf16-input forms (GdrScanArgs::P_bf16), or of fp32 inputs.
inline bool gdr_scan_bf16_inputs_ok(const GdrScanArgs& a) {
  if (gdr_scan_reads_output_grad(a) || a.Pm_bf16 != nullptr || a.Qg_bf16 != nullptr || a.dO_rows != nullptr) {
    return false;
  }
  const bool any = a.P_bf16 != nullptr || a.Q_bf16 != nullptr || a.A_bf16 != nullptr;
  if (!any) return a.A != nullptr && a.P != nullptr && a.Q != nullptr;
  if (a.P_bf16 == nullptr || a.Q_bf16 == nullptr || a.P != nullptr || a.Q != nullptr) return false;
  const bool bf16_out = a.out_state_bf16 != nullptr && a.out_y_bf16 != nullptr && a.out_state == nullptr &&
                        a.out_y == nullptr;
  if (a.E == nullptr) return a.A_bf16 != nullptr && a.A == nullptr && bf16_out;  // the forward form
  return a.A != nullptr && a.A_bf16 == nullptr && a.out_state_bf16 == nullptr && a.out_y_bf16 == nullptr;
}

// Whether a's pointers are the forward's bf16 form (bf16 A, P and Q in, bf16 out_state and out_y,
// no E, no dO) with TF32 products asked for: the form whose products may run as bf16 mma.
inline bool gdr_scan_forward_bf16_form_ok(const GdrScanArgs& a) {
  return gdr_scan_bf16_inputs_ok(a) && a.E == nullptr && a.A_bf16 != nullptr && a.out_state_bf16 != nullptr &&
         !a.tf32x3;
}

#ifdef DD_HAVE_CUDA
// Returns the cudaError_t of the launch (0 = success).
int gdr_scan(const GdrScanArgs& a, void* stream);
// The tensor-core kernel alone in blocks of `cols` (32, 64, 96 or 128) state columns (gdr_scan
// calls it); sizes must pass gdr_scan_mma_supports for that width.
int gdr_scan_tensor_cores(const GdrScanArgs& a, int cols, void* stream);
// gdr_scan_mma_width_for on the current device.
int gdr_scan_mma_width(const GdrScanArgs& a);
// The block width the fused backward form (GdrScanArgs::dO) runs in for a's sizes, variant and
// product mode (the width the bf16-input form would take, where its shared memory fits), or 0 when
// it does not take them; the pointers are not looked at. gdr_scan runs that form when a's
// pointers are its (gdr_scan_fused_form_ok) and this is not 0, and fails otherwise.
int gdr_scan_fused_width(const GdrScanArgs& a);
// The block width of the fused form with bf16 products for a's sizes and variant (the fused form's,
// gdr_scan_fused_width, where gdr_scan_fused_bf16_supports takes it), or 0 when it does not run.
inline int gdr_scan_fused_bf16_width(const GdrScanArgs& a) {
  const int cols = gdr_scan_fused_width(a);
  return cols > 0 && gdr_scan_fused_bf16_supports(a.C, a.dk, a.dv, cols) ? cols : 0;
}
// The fused form with bf16 products in blocks of `cols` columns (gdr_scan calls it for
// GdrScanArgs::bf16_products); cudaErrorInvalidValue for pointers or sizes it does not take.
int gdr_scan_fused_bf16(const GdrScanArgs& a, int cols, void* stream);
// The forward form with bf16 products (GdrScanArgs::bf16_products, gdr_scan_forward_bf16_form_ok)
// in blocks of `cols` columns: gdr_scan calls it; cudaErrorInvalidValue for pointers or sizes it
// does not take.
int gdr_scan_forward_bf16(const GdrScanArgs& a, int cols, void* stream);
// The forward bf16 form and the fused backward form with bf16 dO (GdrScanArgs::dO_bf16, bf16
// products, bf16 y) with each warp owning 16 state columns in registers (kernels/gdr_scan_warps.cu):
// gdr_scan takes them for the automatic variant (kGdrScanAuto) where gdr_scan_warp_columns is on
// (the default) and their width is not 0, in place of gdr_scan_bf16.cu's block kernels. The width
// is the block's columns (64, 96 or 128), 0 where the kernel does not take a's sizes or pointers:
// C 64, dk 96 or 128, dv a multiple of 16, signs ±1, the form's pointers. gdr_scan_warp_width forces
// a width (0: picked for dv; bench train's --gdr-scan).
// The launch counter (both kernels) is for tests.
void gdr_scan_warp_columns(bool on);
bool gdr_scan_warp_columns();
void gdr_scan_warp_width(int cols);
int gdr_scan_forward_warps_width(const GdrScanArgs& a);
int gdr_scan_forward_warps(const GdrScanArgs& a, void* stream);
// The warp-column forward's width where gdr_scan runs it for a (the automatic variant, the switch
// on, its sizes) and the chunk output's tiles leave room for its three buffers (dk 96 at the
// presets' sizes), else 0: where it may also write the chunk output (GdrScanArgs::out_o_bf16).
int gdr_scan_forward_output_width(const GdrScanArgs& a);
int gdr_scan_reverse_warps_width(const GdrScanArgs& a);
int gdr_scan_reverse_warps(const GdrScanArgs& a, void* stream);
int64_t gdr_scan_warp_launches();
// The forward form on Hopper's warpgroup products (kernels/gdr_scan_wgmma.cu, built for sm_90a), off
// by default: measured slower than the warp-column kernel at hybrid base (1.25 against 1.07 ms a
// step; docs/perf.md, stop 63). Switched on (bench train's --gdr-scan wgmma-scan),
// gdr_scan_forward_warps runs it in place of the warp-column kernel where its width (the block's
// 64 state columns) is not 0: the forward's bf16 form with or without the chunk output, C 64, dk 96
// or 128, dv a multiple of 64, signs ±1, n_docs · H ≤ 65535 (the grid's y), and a kernel image for
// this GPU. The launch counter is for tests.
void gdr_scan_wgmma(bool on);
bool gdr_scan_wgmma();
// The warp-column scans fed by two copy warps (kernels/gdr_scan_copy_warps.cu): the same steps and
// bits, with the column warps waiting only for their own step's buffer instead of a __syncthreads a
// step. On by default: gdr_scan_forward_warps and gdr_scan_reverse_warps launch them in place of
// their own kernels where gdr_scan_copy_warps_take says so (the width, the form: backward_form is
// the fused backward form, GdrScanArgs::dO_bf16; the buffers fitting). The launch counter is for
// tests.
void gdr_scan_copy_warps(bool on);
bool gdr_scan_copy_warps();
bool gdr_scan_copy_warps_take(const GdrScanArgs& a, int cols, bool backward_form);
int gdr_scan_copy_warps_launch(const GdrScanArgs& a, int cols, bool backward_form, void* stream);
int64_t gdr_scan_copy_warps_launches();
int gdr_scan_forward_wgmma_width(const GdrScanArgs& a);
int gdr_scan_forward_wgmma(const GdrScanArgs& a, void* stream);
int64_t gdr_scan_wgmma_launches();
// The width of state columns of the tensor-core kernel gdr_scan runs for a's sizes and variant,
// or 0 when it runs an FMA kernel; for the fused form (dO or dO_bf16 set) gdr_scan_fused_width, where 0
// means gdr_scan fails.
int gdr_scan_tensor_core_width(const GdrScanArgs& a);
// Whether gdr_scan takes bf16 inputs (P_bf16, Q_bf16, and in the forward A_bf16) for these
// arguments' sizes and product mode, whichever form: TF32 products on the tensor-core kernel.
inline bool gdr_scan_takes_bf16_inputs(const GdrScanArgs& a) {
  return !a.tf32x3 && gdr_scan_supports(a.C, a.dk) && gdr_scan_tensor_core_width(a) > 0;
}
// Whether gdr_scan takes bf16 outputs (out_state_bf16, out_y_bf16): the same, in the forward (no E).
inline bool gdr_scan_takes_bf16_outputs(const GdrScanArgs& a) { return a.E == nullptr && gdr_scan_takes_bf16_inputs(a); }
// The block width of the forward form with bf16 products for a's sizes and variant (the width the
// TF32 kernel would take, where gdr_scan_forward_bf16_supports takes it), or 0 when it does not run.
inline int gdr_scan_forward_bf16_width(const GdrScanArgs& a) {
  if (gdr_scan_reads_output_grad(a) || a.E != nullptr) return 0;
  const int cols = gdr_scan_tensor_core_width(a);
  return cols > 0 && gdr_scan_forward_bf16_supports(a.C, a.dk, a.dv, cols) ? cols : 0;
}
#endif

}  // namespace kernels
