// The MoE layer's routing between the router's logits and the experts' grouped products
// (model/moe_router.h, model/moe_dispatch.h), as a few small kernels instead of ATen's chain:
// softmax, topk, the top-k sum and division (and their five backward kernels); a stable radix sort
// of the N·k experts, a scatter for its inverse, a division for the tokens, a binary search for the
// counts, a cumsum and a cast; and the dispatch's row gather. At moe-1b's shape (N = 16k tokens,
// E = 64, k = 6, 18 layers) those took about 5 ms of a 146 ms step.
// Raw pointers, no torch; the references are the ATen formulas in model/moe_router.cpp and
// model/moe_dispatch.cpp.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

// Experts and slots the router kernels take: one warp per token holds the token's E logits in
// registers (E / 32 a lane) and picks the k largest one by one.
constexpr int64_t MOE_ROUTER_MAX_EXPERTS = 256;
constexpr int64_t MOE_ROUTER_MAX_K = 16;
inline bool moe_router_supports(int64_t E, int64_t k) {
  return E >= 1 && E <= MOE_ROUTER_MAX_EXPERTS && k >= 1 && k <= MOE_ROUTER_MAX_K && k <= E;
}

// Experts the routing order takes (the scan gives one thread to each expert).
constexpr int64_t MOE_ORDER_MAX_EXPERTS = 1024;
// Pairs each block of the routing order counts and places.
constexpr int64_t MOE_ORDER_CHUNK = 1024;
// Scratch ints the routing order needs for `pairs` (token, slot) pairs over E experts.
inline int64_t moe_order_scratch_ints(int64_t pairs, int64_t E) {
  return (pairs + MOE_ORDER_CHUNK - 1) / MOE_ORDER_CHUNK * E;
}

#ifdef DD_HAVE_CUDA
// logits [N, E] fp32 -> probs [N, E] = softmax(logits); idx [N, k] int64, the k largest probs in
// descending order (ties to the lower expert); w [N, k] fp32 = those probs, divided by their sum
// when `norm`. prob_sums: null, or [moe_router_prob_sum_rows(N), E] fp32, each row the sum of probs
// over a fixed set of tokens (the rows add up to probs' column sums: the aux loss's mean over
// tokens, with kernels/column_sum.h, in place of a pass over probs). Returns the cudaError_t of the
// launch (0 = success).
int moe_router_topk_forward(const float* logits, float* probs, int64_t* idx, float* w, float* prob_sums, int64_t N,
                            int64_t E, int64_t k, bool norm, void* stream);
int64_t moe_router_prob_sum_rows(int64_t N);

// The backward of the forward above: dlogits [N, E] fp32 from dw [N, k] (null: zero) and dprobs
// (null: zero; row t at dprobs + t · dprobs_row_stride, so a stride of 0 takes the broadcast
// gradient of a mean over tokens). probs and idx are the forward's outputs.
int moe_router_topk_backward(float* dlogits, const float* probs, const int64_t* idx, const float* dw,
                             const float* dprobs, int64_t dprobs_row_stride, int64_t N, int64_t E, int64_t k,
                             bool norm, void* stream);

// The pairs' stable order by expert, as a counting sort. flat [P] int64 holds each pair's expert,
// each in [0, E) (the router's top-k indices; not checked, as that would need a host sync: an id
// outside the range indexes shared memory out of bounds); P = N·k. Writes sorted [P] (the expert at each
// position, ascending), order [P] (the pair at each position; equal experts keep pair order),
// inverse [P] (each pair's position), token [P] (order / k), counts [E] int64 and ends [E] int32
// (the running sum of counts: where each expert's slice ends). scratch holds
// moe_order_scratch_ints(P, E) ints. Three launches, no atomics on global memory, deterministic.
int moe_expert_order(const int64_t* flat, int64_t P, int64_t k, int64_t E, int64_t* sorted, int64_t* order,
                     int64_t* inverse, int64_t* token, int64_t* counts, int32_t* ends, int32_t* scratch,
                     void* stream);

// out [R, d] = src[rows[r]] for r < R: the dispatch's gather, one warp per row, 16-byte vectors
// where the rows allow.
int moe_gather_rows(void* out, const void* src, const int64_t* rows, int64_t R, int64_t d, DType dt, void* stream);
#endif

}  // namespace kernels
