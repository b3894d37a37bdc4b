// The gated delta rule backward's products with the chunk states (model/gdr_state_grads.h) in
// fp64 on the CPU, from the same inputs: the truth the CPU and GPU tests hold both paths to.
#pragma once

#include <torch/torch.h>

#include "model/gdr_state_grads.h"

namespace testing_support {

inline model::GdrStateGrads gdr_state_grads_fp64(const torch::Tensor& dO_src, const torch::Tensor& dO_rows,
                                                 const torch::Tensor& dU, const torch::Tensor& h_in,
                                                 const torch::Tensor& dh_next, const torch::Tensor& v_new,
                                                 double scale) {
  auto f64 = [](const torch::Tensor& x) { return x.to(torch::kCPU, torch::kFloat64); };
  const int64_t R = dU.size(0), C = dU.size(1), dv = dU.size(2);
  torch::Tensor dO;
  if (dO_rows.defined()) {
    const auto map = dO_rows.to(torch::kCPU, torch::kLong);
    const auto src = torch::cat({f64(dO_src), torch::zeros({1, dv}, torch::kFloat64)});  // row n: the zeros
    dO = src.index_select(0, torch::where(map < 0, torch::full_like(map, dO_src.size(0)), map)).view({R, C, dv});
  } else {
    dO = f64(dO_src).view({R, C, dv});
  }
  const auto h = f64(h_in), dh = f64(dh_next), vn = f64(v_new);
  model::GdrStateGrads t;
  t.dP_raw = torch::bmm(dO, vn.transpose(1, 2));
  t.dQg = scale * torch::bmm(dO, h.transpose(1, 2));
  t.dW = -torch::bmm(f64(dU), h.transpose(1, 2));
  t.dKd = torch::bmm(vn, dh.transpose(1, 2));
  t.ddecay = (h * dh).sum({1, 2});
  return t;
}

}  // namespace testing_support
