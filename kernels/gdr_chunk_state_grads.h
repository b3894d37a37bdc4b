// The gated delta rule backward's products with the saved chunk states, in one kernel. Per row r
// (one chunk of one head; notation of model/gdr_chunk_core.cpp, s = scale):
//   dQg    = s dO h_inᵀ      [C, dk]   from the output O = s (Qg h_in + P Vn)
//   dP_raw = dO Vnᵀ          [C, C]
//   dW     = −dU h_inᵀ       [C, dk]   from the scan's W (dU: its values' gradient)
//   dKd    = Vn dh_nextᵀ     [C, dk]
//   ddecay = Σ h_in ⊙ dh_next          over the [dk, dv] state
// model/gdr_state_grads.cpp otherwise takes them as four batched products and a row dot, which
// read h_in and dO twice each and write nothing the others can reuse; that is the reference and
// the path for what this kernel does not take.
// Precision as the products it replaces (kernels/gemm_tf32x3.h beside a bf16 operand): h_in, Vn
// and dh_next are bf16 (the states under 16-bit training, model/gdr_scan.h) and widened exactly;
// dO and dU are fp32 and rounded to TF32 (or dU comes in bf16 too, on the fused backward's 16-bit
// path); each product is one TF32 mma with fp32 accumulation. Or, asked for (bf16_products, the
// 16-bit path's default: model::gdr_bf16_state_grads_products), the products are bf16 m16n8k16 mma
// in k-steps of 16: half the mma and half the shared-load instructions, with dO (and an fp32 dU)
// rounded to bf16 as an operand (2⁻⁹ relative where TF32 has 2⁻¹¹); the bf16 operands stay exact.
// dQg, dW and dKd are then bf16 outputs, rounded as much; dP_raw stays fp32, and the tail rounds
// the dPm it makes from it to bf16 for its own products (model::gdr_bf16_tail_products).
// Raw pointers, no torch.
#pragma once

#include <cstdint>

namespace kernels {

struct GdrChunkStateGradsArgs {
  int64_t R = 0;                  // rows (chunks × heads)
  int C = 0, dk = 0, dv = 0;      // chunk length, key and value head sizes
  const void* dO = nullptr;       // [n, dv]: the output gradient's rows, fp32, or bf16 (dO_bf16)
  const int32_t* dO_rows = nullptr;  // [R·C]: the dO row of chunk row r·C + i, −1 for zeros; null: r·C + i
  const void* dU = nullptr;       // [R, C, dv], fp32, or bf16 (dU_bf16: widened exactly)
  const uint16_t* h_in = nullptr;     // [R, dk, dv] bf16 bits: the state each chunk starts from
  const uint16_t* dh_next = nullptr;  // [R, dk, dv] bf16 bits: the gradient of the state it ends in
  const uint16_t* v_new = nullptr;    // [R, C, dv] bf16 bits: Vn
  float scale = 1.f;
  void* dQg = nullptr;      // [R, C, dk], fp32 or bf16 (bf16_out)
  float* dP_raw = nullptr;  // [R, C, C]
  void* dW = nullptr;       // [R, C, dk], fp32 or bf16 (bf16_out)
  void* dKd = nullptr;      // [R, C, dk], fp32 or bf16 (bf16_out)
  float* ddecay = nullptr;  // [R]
  // dQg, dW and dKd rounded to bf16 (the fused backward's 16-bit mode, model::gdr_bf16_chunk_grads):
  // half the bytes written here and read by the solve's backward and the tail.
  bool bf16_out = false;
  bool dU_bf16 = false;
  // dO in bf16 (the 16-bit path's output gradient, model/gdr_chunk_core.h): taken by the bf16 form
  // with a bf16 dU only, which rounds dO to bf16 for its products anyway (the same results as an
  // fp32 dO holding these values, bit for bit). dO then takes a bf16 room of its own, dh_next taking
  // it after the first pass and dU Vn's after the second (gdr_chunk_state_grads_tight, the default),
  // or half the fp32 room, dh_next the other half, staged with it instead of after the first pass.
  bool dO_bf16 = false;
  // The products as bf16 m16n8k16 mma (see the top); taken where dv is a multiple of 16 and the
  // block fits (gdr_chunk_state_grads_bf16_form), TF32 mma otherwise.
  bool bf16_products = false;
  // Rows to skip (nothing written for them but ddecay, which is zeroed for every row first): row r
  // is chunk r / heads's, skipped where chunk_len[chunk] is 0 (a fixed layout's spare chunks, whose
  // outputs only the solve's backward and the tail of the same chunk would read, and both skip such
  // chunks). Null: every row.
  const int32_t* chunk_len = nullptr;
  int64_t heads = 1;
};

// The shared rows' pitch in elements, bf16 and fp32 rows alike, padded so that each fragment load
// of a warp reads distinct banks (kernels/gdr_chunk_state_grads.cu): TF32 form dv + 8; bf16 form a
// pitch of 16 mod 32 (dv itself when it is one, else dv + 16).
inline int64_t gdr_chunk_state_grads_pitch(int64_t dv, bool bf16_form) {
  if (!bf16_form) return dv + 8;
  return dv % 32 == 16 ? dv : dv + 16;
}

// Shared memory one block takes: half of dk's rows of h_in and of dh_next, Vn (bf16) and one fp32
// [C, dv] tile (dO, then dU), each row of gdr_chunk_state_grads_pitch; with a bf16 dU, dh_next and
// dU share the fp32 tile's room (kernels/gdr_chunk_state_grads.cu).
inline int64_t gdr_chunk_state_grads_smem(int64_t C, int64_t dk, int64_t dv, bool dU_bf16, bool bf16_form) {
  const int64_t pitch = gdr_chunk_state_grads_pitch(dv, bf16_form);
  const int64_t bf16_row = 2 * pitch, f32_row = 4 * pitch, half_dk = dk / 2;
  return (half_dk + C) * bf16_row + C * f32_row + (dU_bf16 ? 0 : half_dk * bf16_row) + 64;
}

// Whether a launch takes the bf16 form: asked for, dv a multiple of 16 (its k-step), and its block
// (whose pitch can be 8 elements wider than the TF32 form's) within the 227 KiB a block may opt
// into; else the TF32 form, whose block may still fit.
inline bool gdr_chunk_state_grads_bf16_form(const GdrChunkStateGradsArgs& a) {
  return a.bf16_products && a.dv % 16 == 0 &&
         gdr_chunk_state_grads_smem(a.C, a.dk, a.dv, a.dU_bf16, true) <= 227 * 1024;
}

// Whether the kernel takes these sizes and inputs: C = 64, dk 64, 96 or 128, dv a multiple of 8
// whose block fits the 227 KiB of shared memory a block may opt into, a bf16 dO only in the bf16
// form with a bf16 dU, and 16-byte aligned input pointers. The outputs are checked at the launch (16-byte aligned, as new allocations are).
inline bool gdr_chunk_state_grads_supports(const GdrChunkStateGradsArgs& a) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.R >= 1 && a.R < (int64_t{1} << 30) && a.C == 64 && (a.dk == 64 || a.dk == 96 || a.dk == 128) &&
         a.dv >= 8 && a.dv % 8 == 0 &&
         gdr_chunk_state_grads_smem(a.C, a.dk, a.dv, a.dU_bf16, gdr_chunk_state_grads_bf16_form(a)) <= 227 * 1024 &&
         (!a.dO_bf16 || (a.dU_bf16 && gdr_chunk_state_grads_bf16_form(a))) &&
         aligned(a.dO) && aligned(a.dU) && aligned(a.h_in) && aligned(a.dh_next) && aligned(a.v_new);
}

#ifdef DD_HAVE_CUDA
// Launches on `stream` (a cudaStream_t). Returns the cudaError_t (0 = success);
// cudaErrorInvalidValue for arguments gdr_chunk_state_grads_supports refuses, or a missing or
// misaligned output.
int gdr_chunk_state_grads(const GdrChunkStateGradsArgs& a, void* stream);

// Process-wide switch (default on), for benchmarks and tests: the launches with a bf16 dO (the
// 16-bit path's) stage each operand only while a pass needs it (dh_next after the first pass in dO's
// room, dU after the second in Vn's), 71.6 KiB a block at dk 96, dv 192 and three blocks an SM,
// instead of dh_next beside dO from the start, 97.6 KiB and two. The same products in the same order: the same
// bits either way. Launches of that layout are counted.
void gdr_chunk_state_grads_tight(bool on);
int64_t gdr_chunk_state_grads_tight_launches();
// Process-wide switch (default on), for benchmarks and tests: the tight layout's fixed-size launches
// take a whole row a block (all of dk's columns, dO, Vn and dU staged once a row, 148 KB against
// 221 at hybrid base's sizes; two blocks an SM) instead of a block for each half of dk (off). The
// same products of each output tile in the same order; ddecay's per-row sum in another order.
// Launches counted.
void gdr_chunk_state_grads_whole_row(bool on);
int64_t gdr_chunk_state_grads_whole_row_launches();
#endif

}  // namespace kernels
