// The chunk-local elementwise work of the chunked gated delta rule (model/gdr_chunk_core.h): the
// gather of a layer's tokens into the chunk list with everything derived from the gates, the decay
// masks of the two per-chunk products, and their backward — each one kernel, one block per
// (chunk, head), instead of a chain of ATen copies, casts and elementwise passes. The matmuls stay
// in cuBLAS. Raw pointers, no torch; fp32 math throughout (MODEL.md §0).
//
// Chunk list (model/gdr_chunk_layout.h): chunk n covers tokens chunk_start[n] .. + chunk_len[n] − 1
// of the flattened [B·T] token axis (1 ≤ len ≤ C); rows past len are padding (q = k = v = β = g = 0).
// Per chunk and head, with γ = cumsum(g), e = e^γ, κ = e^{γ_last − γ}, D[i,j] = e^{γ_i − γ_j} (i ≥ j):
//   prep:    X = [Q; K] [2C, dk],  Rw = diag(β e) K,  Ru = diag(β) V,  Kd = diag(κ) K,  Qg = diag(e) Q,
//            γ, b = β, decay = e^{γ_last}
//   masks:   from G = X Kᵀ = [Q Kᵀ; K Kᵀ] [2C, C]:  P = (Q Kᵀ) ⊙ D,  A = strict_lower(diag(b) (K Kᵀ) ⊙ D)
//   masks backward and the input gradients: see gdr_chunk_masks_backward / gdr_chunk_input_grads.
// The ATen references are in model/gdr_chunk_core.cpp (the same formulas, tested against these).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

struct GdrChunkList {
  const int32_t* chunk_start = nullptr;  // [N] first token of the chunk (device memory)
  // [N] its length, 0..C (device memory): rows past it read as zeros, and a fixed layout's spare
  // chunks (model/gdr_plan_slots.h) have none at all.
  const int32_t* chunk_len = nullptr;
  int64_t N = 0, H = 0, C = 0, dk = 0, dv = 0;
};

// The kernels take C ≤ 64 (one [C, C] tile per block in shared memory) and any dk, dv ≥ 1.
inline bool gdr_chunk_supports(int64_t C) { return C >= 1 && C <= 64; }

// The fused kernels (gdr_chunk_front.h, gdr_chunk_solve_backward.h, gdr_chunk_backward_tail.h)
// take C = 64 (their tiles are 16 rows), dk a multiple of 16 up to 128 (Q and K stay in shared
// memory) and dv a multiple of 16 (taken in panels of up to 128 columns): the presets' sizes.
inline bool gdr_chunk_fused_supports(int64_t C, int64_t dk, int64_t dv) {
  return C == 64 && dk >= 16 && dk <= 128 && dk % 16 == 0 && dv >= 16 && dv % 16 == 0;
}

struct GdrChunkPrepArgs {
  const void* q = nullptr;      // [tokens, H, dk], dtype in_qk
  const void* k = nullptr;      // [tokens, H, dk], dtype in_qk
  const void* v = nullptr;      // [tokens, H, dv], dtype in_v; token t at v + t · v_token_stride
  int64_t v_token_stride = 0;   // elements between tokens of v (0: H · dv, contiguous)
  const float* beta = nullptr;  // [tokens, H]
  const float* g = nullptr;     // [tokens, H]
  DType in_qk = DType::F32, in_v = DType::F32;
  float* X = nullptr;      // [N, H, 2C, dk]: Q rows then K rows
  float* Rw = nullptr;     // [N, H, C, dk]
  float* Ru = nullptr;     // [N, H, C, dv]
  float* Kd = nullptr;     // [N, H, C, dk]
  float* Qg = nullptr;     // [N, H, C, dk]
  float* gam = nullptr;    // [N, H, C]
  float* b = nullptr;      // [N, H, C]
  float* decay = nullptr;  // [N, H]
};

// G [N, H, 2C, C] -> P, A [N, H, C, C].
struct GdrChunkMasksArgs {
  const float* G = nullptr;
  const float* gam = nullptr;  // [N, H, C]
  const float* b = nullptr;    // [N, H, C]
  float* P = nullptr;
  float* A = nullptr;
};

// Backward of the masks. Inputs: dA_raw = Tmᵀ dTm Tmᵀ (so dA = −strict_lower(dA_raw)), dP_raw =
// dO Vnᵀ (may be null: no output gradient), G, γ, b and the output scale s. Outputs:
//   dS_sym = dS + dSᵀ with dS = dA ⊙ b_i ⊙ D                   [N, H, C, C]
//   dPm    = s · lower(dP_raw) ⊙ D                             [N, H, C, C] (zero when dP_raw is null)
//   db_A   = Σ_j dA ⊙ S ⊙ D                                    [N, H, C]
//   dgam   = rowsum(Z) − colsum(Z), Z = (dA ⊙ b_i S + dPm ⊙ QKᵀ) ⊙ D   [N, H, C]
struct GdrChunkMasksBackwardArgs {
  const float* dA_raw = nullptr;
  const float* dP_raw = nullptr;
  const float* G = nullptr;
  const float* gam = nullptr;
  const float* b = nullptr;
  float scale = 1.f;
  float* dS_sym = nullptr;
  float* dPm = nullptr;
  float* db_A = nullptr;
  float* dgam = nullptr;
};

// The input gradients, written in the token layout (rows past a chunk's length are dropped):
//   dq = dQ_mm + e ⊙ dQg,   dk = dK_mm + β e ⊙ dRw + κ ⊙ dKd,   dv = β ⊙ dRu
//   dβ = db_A + e Σ(dRw ⊙ K) + Σ(dRu ⊙ V)
//   dγ = dgam + β e Σ(dRw ⊙ K) + e Σ(dQg ⊙ Q) − κ Σ(dKd ⊙ K),  dγ_last += Σ_i κ_i Σ(dKd ⊙ K)_i + ddecay · decay
//   dg = reverse cumsum of dγ over the chunk.
// dQg may be null (no output gradient). V is read from the token-layout v.
struct GdrChunkInputGradsArgs {
  const float* dQ_mm = nullptr;   // [N, H, C, dk] (dPm K)
  const float* dK_mm = nullptr;   // [N, H, C, dk] (dS_sym K + dPmᵀ Q)
  const float* dQg = nullptr;     // [N, H, C, dk] or null
  const float* dRw = nullptr;     // [N, H, C, dk]
  const float* dRu = nullptr;     // [N, H, C, dv]
  const float* dKd = nullptr;     // [N, H, C, dk]
  const float* X = nullptr;       // [N, H, 2C, dk] from prep
  const float* gam = nullptr;     // [N, H, C]
  const float* b = nullptr;       // [N, H, C]
  const float* decay = nullptr;   // [N, H]
  const float* ddecay = nullptr;  // [N, H]
  const float* db_A = nullptr;    // [N, H, C]
  const float* dgam = nullptr;    // [N, H, C]
  const void* v = nullptr;        // [tokens, H, dv], dtype in_v; token t at v + t · v_token_stride
  int64_t v_token_stride = 0;     // elements between tokens of v (0: H · dv, contiguous)
  DType in_qk = DType::F32, in_v = DType::F32;
  void* dq = nullptr;             // [tokens, H, dk], dtype in_qk
  void* dk = nullptr;             // [tokens, H, dk], dtype in_qk
  void* dv = nullptr;             // [tokens, H, dv], dtype in_v, contiguous
  float* dbeta = nullptr;         // [tokens, H]
  float* dg = nullptr;            // [tokens, H]
};

#ifdef DD_HAVE_CUDA
// Each returns the cudaError_t of the launch (0 = success); cudaErrorInvalidValue for sizes the
// kernels do not take.
int gdr_chunk_prep_forward(const GdrChunkList& l, const GdrChunkPrepArgs& a, void* stream);
int gdr_chunk_masks_forward(const GdrChunkList& l, const GdrChunkMasksArgs& a, void* stream);
int gdr_chunk_masks_backward(const GdrChunkList& l, const GdrChunkMasksBackwardArgs& a, void* stream);
int gdr_chunk_input_grads(const GdrChunkList& l, const GdrChunkInputGradsArgs& a, void* stream);
#endif

}  // namespace kernels
