// The LM head and its loss in one: mean cross-entropy of (h · wᵀ) against targets, computed in
// chunks of rows so the logits of the whole batch never exist at once (at vocab 50304 × 16k tokens
// they would be 3.3 GB in fp32). Each chunk's gradients (dh, and dW summed over chunks) are formed
// in the forward while its logits are at hand, and scaled by the incoming gradient in backward — no
// recompute. The logits are rounded to the matmul dtype and every statistic is fp32, as in the
// plain head (matmul, cast to fp32, cross_entropy), which stays the reference.
#pragma once

#include <torch/torch.h>

namespace model {

struct LinearCrossEntropyOptions {
  double softcap = 0;          // > 0: z ← c·tanh(z/c) before the softmax
  int64_t chunk_rows = 0;      // rows per chunk; 0: even chunks of at most kChunkBytes of logits
  bool use_kernel = true;      // CUDA: the fused loss + gradient kernel (kernels/cross_entropy.h)
};

// At most this much logit memory per chunk when chunk_rows = 0, in the logits' own dtype (bf16
// under autocast), the rows split evenly over the fewest chunks that fit: larger chunks mean fewer
// passes of the fp32 dW accumulation over the [V, d] matrix and larger products (GPT-124M, 16k
// tokens: two chunks of 8192 rows measured 1.4% faster per step than 256 MiB chunks, for 0.5 GiB
// more peak memory).
constexpr int64_t kChunkBytes = 1ll << 30;

// h [N,d], w [V,d], targets [N] int64 (−1: ignored). The matmul runs in the autocast dtype when
// autocast is on for h's device, else in h's dtype. Returns a 0-dim fp32 loss (fp64 for fp64 h).
torch::Tensor linear_cross_entropy(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& targets,
                                   const LinearCrossEntropyOptions& opts = {});

// The plain path the chunked one is tested against: whole logits, then cross_entropy.
torch::Tensor linear_cross_entropy_reference(const torch::Tensor& h, const torch::Tensor& w,
                                             const torch::Tensor& targets, double softcap = 0);

}  // namespace model
