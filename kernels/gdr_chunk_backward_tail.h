// The end of the chunked gated delta rule's backward as one kernel, one block per (chunk, head):
// from the gradients reaching the solve's inputs and the output products to the gradients of the
// layer's inputs, in the notation of kernels/gdr_chunk.h (b = β, e = e^γ, κ = e^{γ_last − γ},
// D[i,j] = e^{γ_i − γ_j} for i ≥ j, s the output scale):
//   S = K Kᵀ, QK = Q Kᵀ (recomputed from q and k)
//   dA = −strict_lower(dA_raw),  dS = dA ⊙ b_i ⊙ D,  dPm = s · lower(dP_raw) ⊙ D
//   dq = dPm K + e ⊙ dQg
//   dk = (dS + dSᵀ) K + dPmᵀ Q + b e ⊙ dRw + κ ⊙ dKd
//   dv = b ⊙ dRu                  (or taken by the solve's backward, see dbeta_v)
//   dβ = Σ_j dA S D + e Σ(dRw ⊙ K) + Σ(dRu ⊙ V)
//   dγ = rowsum(Z) − colsum(Z) + b e Σ(dRw ⊙ K) + e Σ(dQg ⊙ Q) − κ Σ(dKd ⊙ K), Z = dS ⊙ S + dPm ⊙ QK,
//        and dγ_last += Σ_i κ_i Σ(dKd ⊙ K)_i + ddecay · decay;  dg = reverse cumsum of dγ.
//   and optionally L2Norm's backward on dq and dk (q_rstd, k_rstd below).
// model/gdr_chunk_core.cpp otherwise takes this as the recomputed X Kᵀ product, the masks' backward
// kernel, three batched products and the input-gradient kernel (kernels/gdr_chunk.h), which stay
// as the reference and for the sizes this kernel does not take. Every output is a token's, so a
// chunk of no tokens (a fixed layout's spare chunk, model/gdr_plan_slots.h) is skipped.
#pragma once

#include <cstdint>

#include "kernels/gdr_chunk.h"

namespace kernels {

struct GdrChunkBackwardTailArgs {
  const void* q = nullptr;      // [tokens, H, dk], dtype in_qk
  const void* k = nullptr;      // [tokens, H, dk], dtype in_qk
  const void* v = nullptr;      // [tokens, H, dv], dtype in_v; token t at v + t · v_token_stride
  int64_t v_token_stride = 0;   // elements between tokens of v (0: H · dv, contiguous)
  const float* beta = nullptr;  // [tokens, H]
  const float* g = nullptr;     // [tokens, H]
  DType in_qk = DType::F32, in_v = DType::F32;
  float scale = 1.f;
  const float* dA_raw = nullptr;  // [N, H, C, C]: only the strictly lower triangle is read
  const float* dP_raw = nullptr;  // [N, H, C, C] or null (no output gradient)
  const void* dQg = nullptr;      // [N, H, C, dk] or null (no output gradient); fp32 or bf16 (bf16_grads)
  const void* dRw = nullptr;      // [N, H, C, dk]; fp32 or bf16 (bf16_grads)
  const float* dRu = nullptr;     // [N, H, C, dv]; unused when dbeta_v is set
  // When set, the solve's backward has taken dRu's part (GdrChunkSolveBackwardArgs::dv): it wrote
  // dv, and dbeta_v [N, H, C] holds Σ_c dRu ⊙ V per chunk row. v, dRu and dv are then not touched.
  const float* dbeta_v = nullptr;
  const void* dKd = nullptr;      // [N, H, C, dk]; fp32 or bf16 (bf16_grads)
  const float* ddecay = nullptr;  // [N, H]
  void* dq = nullptr;             // [tokens, H, dk], dtype in_qk
  void* dk = nullptr;             // [tokens, H, dk], dtype in_qk
  void* dv = nullptr;             // [tokens, H, dv], dtype in_v, contiguous
  float* dbeta = nullptr;         // [tokens, H]
  float* dg = nullptr;            // [tokens, H]
  // With q_rstd and k_rstd ([tokens, H] fp32; both or neither), q and k are L2Norm's outputs
  // y = x · r (r = 1/sqrt(Σ x² + eps) per token and head, MODEL.md §4) and dq, dk are the
  // gradients of its inputs x instead: dx = r (dy − y Σ(y ⊙ dy)), dy the gradient above (in fp32)
  // and y the q or k given, stored once, with no pass of the norm's own after this kernel. Only
  // where gdr_chunk_backward_tail_takes_norm says so.
  const float* q_rstd = nullptr;
  const float* k_rstd = nullptr;
  // dQg, dRw and dKd come in bf16 (the fused backward's 16-bit mode, model::gdr_bf16_chunk_grads);
  // taken with q, k and v of one 16-bit type only.
  bool bf16_grads = false;
  // With bf16_grads and bf16 q, k, v: dq and dk's products take dS and dPm rounded to bf16 (2⁻⁹
  // relative) as bf16 m16n8k16 mma beside the staged bf16 K and Q, one mma per 16 × 8 × 16 tile,
  // where the split-TF32 form keeps them to about 2⁻²¹ with two m16n8k8 per 16 × 8 × 8
  // (model::gdr_bf16_tail_products).
  bool bf16_products = false;
};

#ifdef DD_HAVE_CUDA
// Returns the cudaError_t of the launch (0 = success); cudaErrorInvalidValue for sizes
// gdr_chunk_fused_supports refuses, bf16_grads beside other input types, bf16_products without
// bf16_grads and bf16 inputs, or one of q_rstd and k_rstd without the other or where the kernel
// does not take them.
int gdr_chunk_backward_tail(const GdrChunkList& l, const GdrChunkBackwardTailArgs& a, void* stream);
// Whether the launch for l and a (q_rstd aside) may take L2Norm's backward: the instance it runs
// covers each half of dk in one pass (bf16 q, k, v and products, bf16_grads, the fixed head sizes'
// instance at dk 96, dv 192, kernels/gdr_head_sizes.h).
bool gdr_chunk_backward_tail_takes_norm(const GdrChunkList& l, const GdrChunkBackwardTailArgs& a);
#endif

}  // namespace kernels
