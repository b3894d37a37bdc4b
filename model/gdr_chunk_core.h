// The chunked gated delta rule (MODEL.md §4) from the token layout to the chunk list's outputs, as
// one differentiable op with a hand-written backward. Autograd through the same forward recorded
// ~40 ops per layer and saved their intermediates ([N,H,C,C] masks, products, the solve's
// operands); this saves the inputs, (I + A)⁻¹, W and the scan's outputs, recomputes the cheap rest
// in the backward, and runs the state scan's backward once, in reverse.
//
// Per chunk (rows i, j of the chunk; b = β, γ = cumsum(g), D[i,j] = e^{γ_i − γ_j} for i ≥ j):
//   A = strict_lower(diag(b) K Kᵀ ⊙ D);  Tm = (I + A)⁻¹
//   W = Tm diag(b e^γ) K;  U = Tm diag(b) V;  Kd = diag(e^{γ_last − γ}) K;  decay = e^{γ_last}
//   scan (model/gdr_scan.h): h_in, Vn = U − W h_in, h_next = decay h_in + Kdᵀ Vn
//   O = scale · (diag(e^γ) Q h_in + ((Q Kᵀ) ⊙ D) Vn)
// On a GPU in fp32 with C ≤ 64 the gather, the gate math, the masks and the backward's elementwise
// work are CUDA kernels (kernels/gdr_chunk.h) around split-TF32 products (under TF32 scan products
// the saved h_in and v_new are bf16 and the products against them take one mma, model/gdr_scan.h;
// the fused front's W, U, Kd, Qg and P are bf16 too, gdr_bf16_front); at C = 64 the forward's
// whole front (gather to W, U, P and Tm) is one kernel (kernels/gdr_chunk_front.h), and so is the
// backward through the solve (kernels/gdr_chunk_solve_backward.h). Elsewhere each piece is its ATen
// twin (gdr_chunk_core.cpp). Both are tested against autograd through gdr_forward_ref
// (tests/model/test_gdr.cpp on the CPU, tests/model/test_gdr_scan_cuda.cpp on the GPU).
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "model/gdr.h"
#include "model/gdr_chunk_layout.h"

namespace model {

struct GdrChunkCoreOutput {
  torch::Tensor O;        // [N, H, C, dv] in the compute dtype (or bf16), or [B, T, H, dv] with o_targets
  torch::Tensor h_final;  // [n_docs · H, dk, dv] in sorted document order
};

// q, k [B,T,H,dk], v [B,T,H,dv], beta and g [B,T,H] in the token layout of `l`; h0 [n_docs · H,
// dk, dv] in the compute dtype (fp32 or fp64), which the inputs are cast to, or an empty tensor of
// that dtype: zero states, which the forward scan's kernel then starts from with no tensor of zeros
// (and h0 gets no gradient). Differentiable in all six. Any thread may call it; bad shapes throw
// c10::Error.
// o_targets (gdr_chunk_row_targets, optional): O comes back in the token layout [B, T, H, dv],
// each chunk row written where it belongs by the output product (no copy after it).
// bf16_output_ok: the caller takes O in bf16 (the Gated DeltaNet's output norm does, fused or not).
// It comes so, with gdr_bf16_output on, in the chunk layout (no o_targets) on the 16-bit path: the
// bf16 front (gdr_bf16_front) with bf16 v. O's gradient then comes back in bf16, which the reverse
// scan and the state products read as it is (they round it to bf16 for their products anyway).
// qk_norm (model/gdr.h): q and k are L2Norm's inputs; the op normalises them first and saves the
// norm's scales, and its backward returns their gradients: from the fused tail kernel where it
// takes the norm (kernels::gdr_chunk_backward_tail_takes_norm: the 16-bit path at dk 96, dv 192),
// else by the norm's own backward after the core's (model/fused_l2norm.h, the same as the norm's
// op would run).
GdrChunkCoreOutput gdr_chunk_core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& beta, const torch::Tensor& g, const torch::Tensor& h0,
                                  const GdrChunkLayout& l, double scale, const torch::Tensor& o_targets = {},
                                  bool bf16_output_ok = false, const GdrQkNorm& qk_norm = {});

// Process-wide switch (default on), for benchmarks and tests: whether gdr_chunk_core writes O in
// bf16 where the caller allows it (bf16_output_ok): half the bytes for the output product's write,
// the norm's reads of o and its write of o's gradient, and the two reads of that gradient after.
void gdr_bf16_output(bool on);
bool gdr_bf16_output();

// Process-wide switch for benchmarks and tests that compare the kernels with the ATen pieces
// (default on). Covers the chunk kernels and the scan kernel (model/gdr_scan.h).
void gdr_use_kernels(bool on);

// Process-wide switch (default on) between the fused chunk kernels and the separate launches they
// replace, for the test and benchmarks comparing them: the forward's front (prep, X Kᵀ, masks,
// inverse and two products in kernels/gdr_chunk_front.h) and the backward through the solve (six
// products, kernels/gdr_chunk_solve_backward.h).
void gdr_use_fused_kernels(bool on);

// Process-wide switch (default on), for the benchmarks and tests comparing them: under TF32 scan
// products with bf16 states (16-bit training), the fused front writes W, U, Kd, Qg and P in bf16
// and everything after it reads them so (half their bytes, bf16's 2⁻⁹ rounding added); off keeps
// them fp32.
void gdr_bf16_front(bool on);

// Process-wide switch (default on), for the benchmarks and tests comparing them: with the bf16
// front and 16-bit q, k and v of one type, the backward through the solve
// (kernels/gdr_chunk_solve_backward.h) takes its fp32 operands rounded to TF32, one mma per
// product, as the scan's TF32 products do; off keeps them split in two TF32 parts.
void gdr_tf32_chunk_products(bool on);

// Process-wide switch (default on), for the benchmarks and tests comparing them: with the fused
// kernels, the forward keeps its front's Kd, Qg, P and decay for the backward (in bf16 under the
// bf16 front: at bench gdr's shape 168 MB a layer, 50 MB at hybrid base's) instead of the backward
// running the front's kernel again for them. The values are the same either way (one kernel, one
// code path up to those outputs). gdr_front_recomputes counts the backward's recomputes.
void gdr_save_front(bool on);
int64_t gdr_front_recomputes();

// Process-wide switch (default on), for benchmarks and tests: where the rule takes L2Norm of q and
// k (GdrQkNorm) on the 16-bit path, the fused front normalises them as it stages them
// (kernels::GdrChunkFrontArgs::q_norm), reading q and k in place in the short conv's rows, instead
// of the norm's own kernel running before it. The same arithmetic, up to the order of each row's
// sum of squares. gdr_front_norms counts the forwards that took it.
void gdr_l2norm_in_front(bool on);
int64_t gdr_front_norms();

// Process-wide switch (default on), for benchmarks and tests: with the fused kernels, the solve's
// backward writes v's gradient and Σ dRu ⊙ V itself instead of dRu (fp32 [N, H, C, dv]) for the
// backward's tail to read (kernels/gdr_chunk_solve_backward.h). The same values either way, up to
// the order of one per-row sum.
void gdr_dv_in_solve(bool on);

// Process-wide switch (default on), for benchmarks and tests: with the fused kernels, bf16 states
// (TF32 products) and q, k, v of one 16-bit type, the backward keeps five intermediates in bf16
// instead of fp32: dU from the reverse scan, dQg, dKd and dW from the products with the states
// (model/gdr_state_grads.h) and dRw from the solve's backward, each rounded once (2⁻⁹ relative),
// as the states and dh_next are. Half their bytes written and read.
void gdr_bf16_chunk_grads(bool on);

// Process-wide switch (default on), for benchmarks and tests: in that 16-bit mode, the reverse
// scan takes its four products as bf16 mma (kernels::GdrScanArgs::bf16_products: dO, the state
// gradient and dU rounded to bf16 as operands, 2⁻⁹ relative, where TF32 rounds them to 2⁻¹¹) where
// its sizes allow (kernels::gdr_scan_fused_bf16_width). Sums and the running state stay fp32.
void gdr_bf16_scan_products(bool on);

// Process-wide switch (default on), for benchmarks and tests: in that 16-bit mode with bf16 q, k
// and v, the backward's tail takes dq = dPm K and dk = (dS + dSᵀ) K + dPmᵀ Q as bf16 mma, dS and dPm
// rounded to bf16 (2⁻⁹ relative), instead of split-TF32 products that keep them to about 2⁻²¹
// (kernels::GdrChunkBackwardTailArgs::bf16_products).
void gdr_bf16_tail_products(bool on);

// Process-wide switch (default on), for benchmarks and tests: in that 16-bit mode with bf16 q, k
// and v, the solve's backward keeps dW, dU, K and V as bf16 tiles and takes dTm's products with
// them as bf16 mma (kernels::GdrChunkSolveBackwardArgs::bf16_tiles): the same exact products of bf16
// values, summed in another order, in two thirds of the shared memory.
void gdr_bf16_solve_tiles(bool on);
// How many of the solve backward's launches took the bf16 tiles (tests check the path was taken).
int64_t gdr_bf16_solve_tile_launches();
// How many backward tails took L2Norm's backward (GdrQkNorm; tests check the path was taken).
int64_t gdr_tail_norm_launches();

}  // namespace model
