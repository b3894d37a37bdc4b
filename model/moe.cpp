// MoE feed-forward (MODEL.md §3). The fast path sorts the N·k (token, expert) pairs by expert so
// every expert's rows are one contiguous slice (no padding, no capacity, nothing dropped) and runs
// all experts in one grouped GEMM per weight (model/grouped_linear.h). In bf16 on Hopper the
// slices are given to the GEMM as device offsets, so the layer never waits for the GPU (and a step
// can be captured as a CUDA graph); elsewhere their sizes need one device-to-host copy of the
// counts. It must keep matching forward_reference().
// (Padding every expert to the largest count, for plain batched matmuls, was tried: at moe-1b's
// start one expert drew ~60% of the tokens, the padded block was 6× the work and ran out of memory.)
#include "model/moe.h"

#include "model/expert_product.h"
#include "model/fused_swiglu.h"
#include "model/grouped_linear.h"
#include "model/moe_dispatch.h"
#include "model/moe_router.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>

namespace model {
namespace {

std::atomic<bool> weights_in_swiglu{true};

torch::Tensor as_dtype(const torch::Tensor& t, torch::ScalarType s) {
  return t.scalar_type() == s ? t : t.to(s);
}

// One expert: silu(x gᵀ) ⊙ (x uᵀ) dᵀ with x [n,d], g,u [fe,d], dn [d,fe].
torch::Tensor expert_swiglu(const torch::Tensor& x, const torch::Tensor& g, const torch::Tensor& u,
                            const torch::Tensor& dn) {
  return torch::matmul(torch::silu(torch::matmul(x, g.t())) * torch::matmul(x, u.t()), dn.t());
}

// The layer's fp32 input as itself for the router (which runs in fp32, MODEL.md §0) and rounded
// once to the experts' dtype for the routed and shared experts. Backward: the router's fp32
// gradient and the experts' low-precision one summed in one pass, in fp32. Through autograd the
// experts' two casts of u (routed, shared) each came back as a cast of their gradient to fp32, and
// the three gradients met in two fp32 additions: about 5.6 ms of a moe-1b step. Now the routed
// and shared experts' gradients, both of one bf16 tensor, are summed by autograd in bf16 first (as
// for any activation two bf16 products read): one more bf16 rounding of that sum than before.
struct RouterAndExpertInputsFn : public torch::autograd::Function<RouterAndExpertInputsFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& u,
                                                int64_t dtype) {
    ctx->saved_data["dtype"] = static_cast<int64_t>(u.scalar_type());
    return {u, u.to(static_cast<torch::ScalarType>(dtype))};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dt = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto &g_router = grads[0], &g_experts = grads[1];
    torch::Tensor du;
    if (g_router.defined() && g_experts.defined()) du = torch::add(g_router, g_experts);  // one pass, in fp32
    else if (g_router.defined()) du = g_router;
    else if (g_experts.defined()) du = g_experts.to(dt);
    return {du, torch::Tensor()};
  }
};

// Assignments per expert, [E] int64 on flat's device. Not bincount: on a GPU that reads the
// input's max and min back to the host.
torch::Tensor expert_counts(const torch::Tensor& flat, int64_t E) {
  return torch::zeros({E}, flat.options()).scatter_add_(0, flat, torch::ones_like(flat));
}

}  // namespace

MoEImpl::MoEImpl(const ModelConfig& c)
    : d_(c.d), E_(c.moe_experts), k_(c.moe_top_k), fe_(c.moe_expert_hidden), norm_topk_(c.moe_norm_topk),
      alpha_(c.moe_aux_coef) {
  TORCH_CHECK(E_ > 0 && k_ > 0 && k_ <= E_, "moe: need 0 < k <= E, got E=", E_, " k=", k_);
  router = register_parameter("router", torch::empty({E_, d_}));
  gate = register_parameter("gate", torch::empty({E_, fe_, d_}));
  up = register_parameter("up", torch::empty({E_, fe_, d_}));
  down = register_parameter("down", torch::empty({E_, d_, fe_}));
  if (c.moe_shared_hidden > 0) shared = register_module("shared", SwiGLU(d_, c.moe_shared_hidden));
  reset_parameters(c.init_std, c.init_std / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(c.n_layers, 1))));
}

void MoEImpl::reset_parameters(double std0, double std_out) {
  torch::NoGradGuard no_grad;
  router.normal_(0.0, std0);
  gate.normal_(0.0, std0);
  up.normal_(0.0, std0);
  down.normal_(0.0, std_out);
  if (!shared.is_empty()) {
    shared->gate->weight.normal_(0.0, std0);
    shared->up->weight.normal_(0.0, std0);
    shared->down->weight.normal_(0.0, std_out);
  }
}

bool MoEImpl::counts_stay_on_device(const ModelConfig& c, const c10::Device& device, c10::ScalarType dtype) {
  return grouped_linear_offsets_supported(device, dtype, 2 * c.moe_expert_hidden, c.d) &&  // gate|up
         grouped_linear_offsets_supported(device, dtype, c.d, c.moe_expert_hidden);        // down
}

MoERouting MoEImpl::route(const torch::Tensor& u2) {
  TORCH_CHECK(u2.dim() == 2 && u2.size(1) == d_ && u2.size(0) > 0, "moe: expected tokens [N>0,", d_, "], got ",
              u2.sizes());
  const auto rt = u2.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  // The router runs in fp32 even under autocast (MODEL.md §0).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  auto logits = torch::matmul(as_dtype(u2, rt), as_dtype(router, rt).t());  // [N,E]
  auto top = router_topk(logits, k_, norm_topk_);  // softmax, top-k, renormalised (model/moe_router.h)
  return {top.probs, top.idx, top.w, top.mean_probs};
}

torch::Tensor MoEImpl::aux_loss(const MoERouting& r) const {
  return aux_loss(r, expert_counts(r.topk_idx.reshape({-1}), E_));
}

torch::Tensor MoEImpl::aux_loss(const MoERouting& r, const torch::Tensor& counts_per_expert) const {
  const int64_t N = r.probs.size(0);
  // f_e counts assignments: integer counts, so no gradient can flow through it.
  auto counts = counts_per_expert.to(r.probs.scalar_type());  // [E]
  auto f = counts * (static_cast<double>(E_) / static_cast<double>(k_ * std::max<int64_t>(N, 1)));
  const auto& P = r.mean_probs;                                                                   // [E]
  return alpha_ * (f * P).sum();
}

MoEOutput MoEImpl::forward(const torch::Tensor& u) {
  TORCH_CHECK(u.size(-1) == d_, "moe: expected u [..., ", d_, "], got ", u.sizes());
  auto u2 = u.reshape({-1, d_});  // [N,d]
  const auto mdt = matmul_dtype(u2);
  // u for the router and u for the experts (the same tensor when they run in one dtype). On a GPU
  // an fp32 u reaches the router and the experts' 16-bit rows through one kernel each way
  // (model/moe_dispatch.h); the experts' tensors are filled once the routing has ordered them.
  const bool fused_inputs = moe_inputs_fused(u2, k_, mdt);
  MoEInputs inputs;
  torch::Tensor u_router = u2, u_experts;
  if (fused_inputs) {
    inputs = moe_inputs_open(u2, k_, mdt, !shared.is_empty());
    u_router = inputs.router;
  } else if (u2.scalar_type() == torch::kFloat32 && mdt != torch::kFloat32 && at::GradMode::is_enabled() &&
             u2.requires_grad()) {
    auto both = RouterAndExpertInputsFn::apply(u2, static_cast<int64_t>(mdt));
    u_router = both[0];
    u_experts = both[1];
  } else {
    u_experts = as_dtype(u2, mdt);
  }
  auto r = route(u_router);
  auto flat = r.topk_idx.reshape({-1});  // [N·k] expert of each (token, slot) pair
  const auto order = expert_order(flat, k_, E_);
  const auto& counts = order.counts;  // [E], on the device
  // Rows move by gathers both ways (model/moe_dispatch.h): no atomics, deterministic.
  torch::Tensor xs;  // [N·k,d] expert order
  if (fused_inputs) {
    moe_inputs_fill(inputs, u2, order);
    xs = inputs.rows;
    u_experts = inputs.experts;
  } else {
    xs = dispatch_rows(u_experts, order, k_);
  }
  // Every expert's rows through its gate|up and down weights: one grouped GEMM each on a GPU, with
  // the slices as device offsets where the GEMM takes them, else as host counts (read once).
  std::vector<int64_t> rows;
  auto grouped = [&](const torch::Tensor& x, const torch::Tensor& w) {
    if (grouped_linear_offsets_supported(x, w)) {
      return grouped_linear_offsets(x, w, order.ends);
    }
    if (rows.empty()) {
      const auto host = counts.cpu();  // the host sync of this path
      rows.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + E_);
    }
    return grouped_linear(x, w, rows);
  };
  // The experts' activation, with each row's γ applied there when weights_in_swiglu.
  const bool gamma_in_swiglu = weights_in_swiglu;
  auto activation = [&](const torch::Tensor& gu) {
    return gamma_in_swiglu ? swiglu_weighted(gu, r.topk_w.reshape({-1}), order.order) : swiglu(gu);
  };
  torch::Tensor ys;  // [N·k,d] expert order
  if (expert_product_applies(xs, {gate, up}, mdt)) {
    // The fp32 weights' kept bf16 copies, their gradients straight into .grad (model/expert_product.h).
    auto h = activation(expert_product(xs, {gate, up}, order.ends, mdt));  // [N·k,fe]
    ys = expert_product_applies(h, {down}, mdt) ? expert_product(h, {down}, order.ends, mdt)
                                                : grouped(h, as_dtype(down, mdt));
  } else {
    auto gate_up = torch::cat({as_dtype(gate, mdt), as_dtype(up, mdt)}, 1);  // [E,2fe,d]
    auto h = activation(grouped(xs, gate_up));                               // [N·k,fe]
    ys = grouped(h, as_dtype(down, mdt));
  }
  // Back to token order, summed over the k slots (weighted by γ here unless the activation was)
  // and added to the shared expert's output, in one pass.
  const auto shared_y = shared.is_empty() ? torch::Tensor() : shared(u_experts);
  auto y = gamma_in_swiglu ? combine_sum(ys, order, k_, shared_y) : combine_weighted(ys, order, r.topk_w, shared_y);
  return {y.view(u.sizes()), aux_loss(r, counts)};
}

void moe_router_weights_in_swiglu(bool on) { weights_in_swiglu = on; }

MoEOutput MoEImpl::forward_reference(const torch::Tensor& u) {
  TORCH_CHECK(u.size(-1) == d_, "moe: expected u [..., ", d_, "], got ", u.sizes());
  auto u2 = u.reshape({-1, d_});  // [N,d]
  const int64_t N = u2.size(0);
  auto r = route(u2);
  const auto dt = u2.scalar_type();
  torch::Tensor y;  // [N,d], created in the experts' output dtype (bf16 under autocast)
  for (int64_t e = 0; e < E_; ++e) {
    auto hit = torch::nonzero(r.topk_idx == e);  // [n_e,2] (token, slot)
    if (hit.size(0) == 0) continue;
    auto tok = hit.select(1, 0), slot = hit.select(1, 1);
    auto gamma = r.topk_w.index({tok, slot}).unsqueeze(1);                    // [n_e,1]
    auto ye = expert_swiglu(u2.index_select(0, tok), as_dtype(gate[e], dt), as_dtype(up[e], dt),
                            as_dtype(down[e], dt));
    if (!y.defined()) y = torch::zeros({N, d_}, ye.options());
    y = y.index_add(0, tok, as_dtype(gamma, ye.scalar_type()) * ye);
  }
  if (!shared.is_empty()) y = y + shared(u2);
  return {y.view(u.sizes()), aux_loss(r)};
}

}  // namespace model
