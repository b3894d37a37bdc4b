// What the delta rule's output-layout tests share (tests/model/test_gdr.cpp on the CPU,
// tests/model/test_gdr_scan_cuda.cpp on the GPU): one forward and backward of the chunk core whose
// output comes back in token order, either written there by the output product (row targets) or
// copied there after it.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "model/gdr_chunk_core.h"
#include "model/gdr_chunk_layout.h"

namespace testing_support {

// The token-order output o [B,T,H,dv] and the gradients of q, k, v, β and g for the loss Σ o ⊙
// grad_o, with a zero initial state. direct: through model::gdr_chunk_row_targets; else the chunk
// rows through model::gdr_scatter_chunks.
inline std::vector<torch::Tensor> gdr_token_output_and_grads(const std::vector<torch::Tensor>& qkvbg,
                                                             const model::GdrChunkLayout& layout, double scale,
                                                             const torch::Tensor& grad_o, bool direct) {
  std::vector<torch::Tensor> x;
  for (const auto& t : qkvbg) x.push_back(t.detach().clone().requires_grad_(true));
  const int64_t H = x[0].size(2), dk = x[0].size(3), dv = x[2].size(3);
  const auto h0 = torch::zeros({layout.scan.n_docs * H, dk, dv}, grad_o.options());
  const auto targets = direct ? model::gdr_chunk_row_targets(layout, H, x[0].device()) : torch::Tensor();
  auto core = model::gdr_chunk_core(x[0], x[1], x[2], x[3], x[4], h0, layout, scale, targets);
  auto o = direct ? core.O : model::gdr_scatter_chunks(core.O, layout);
  (o * grad_o).sum().backward();
  std::vector<torch::Tensor> out{o.detach()};
  for (auto& t : x) out.push_back(t.grad());
  return out;
}

}  // namespace testing_support
