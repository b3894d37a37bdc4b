#include "model/linear_cross_entropy.h"

#include "model/layers.h"
#include "model/linear.h"
#include "model/mixed_linear.h"
#include "model/weight_shadow.h"

#include <ATen/autocast_mode.h>

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/cross_entropy.h"
#endif

#include <algorithm>

namespace model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType stat_dtype(at::ScalarType t) { return t == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32; }

int64_t rows_per_chunk(int64_t N, int64_t V, int64_t elem_bytes, const LinearCrossEntropyOptions& o) {
  if (o.chunk_rows > 0) return std::min(N, o.chunk_rows);
  if (N == 0) return 1;
  const int64_t fit = std::max<int64_t>(1, std::min(N, kChunkBytes / (V * elem_bytes)));
  const int64_t chunks = (N + fit - 1) / fit;
  return (N + chunks - 1) / chunks;
}

bool kernel_applies(const torch::Tensor& z, const LinearCrossEntropyOptions& o) {
#if defined(DD_HAVE_CUDA)
  return o.use_kernel && o.softcap <= 0 && z.is_cuda() &&
         (z.scalar_type() == torch::kBFloat16 || z.scalar_type() == torch::kFloat32);
#else
  (void)z;
  (void)o;
  return false;
#endif
}

// One chunk's per-row losses [n] (stat dtype) and, when `grad` is set, the gradient of Σ loss with
// respect to z written into *grad (z's dtype). z [n,V] in the matmul dtype.
torch::Tensor chunk_loss(torch::Tensor& z, const torch::Tensor& t, const LinearCrossEntropyOptions& o,
                         torch::Tensor* grad) {
#if defined(DD_HAVE_CUDA)
  if (grad && kernel_applies(z, o)) {
    z = z.contiguous();
    auto loss = torch::empty({z.size(0)}, z.options().dtype(torch::kFloat32));
    auto tt = t.to(torch::kInt64).contiguous();
    const int err = kernels::cross_entropy_grad_inplace(
        z.data_ptr(), z.scalar_type() == torch::kBFloat16, z.size(1), loss.data_ptr<float>(), tt.data_ptr<int64_t>(),
        z.size(0), z.size(1), 1.0f, c10::cuda::getCurrentCUDAStream(z.device().index()).stream());
    TORCH_CHECK(err == 0, "cross-entropy kernel launch failed (cudaError ", err, ")");
    *grad = z;  // the logits were overwritten by their gradient
    return loss;
  }
#endif
  auto zf = z.to(stat_dtype(z.scalar_type()));
  torch::Tensor th;
  if (o.softcap > 0) {
    th = torch::tanh(zf / o.softcap);
    zf = th * o.softcap;
  }
  auto valid = t >= 0;
  auto tc = t.clamp_min(0).unsqueeze(1);
  auto lse = torch::logsumexp(zf, 1);
  auto loss = (lse - zf.gather(1, tc).squeeze(1)) * valid.to(zf.scalar_type());
  if (grad) {
    auto g = torch::exp(zf - lse.unsqueeze(1));
    g.scatter_add_(1, tc, -valid.to(g.scalar_type()).unsqueeze(1));
    g.mul_(valid.to(g.scalar_type()).unsqueeze(1));
    if (o.softcap > 0) g.mul_(1 - th * th);
    *grad = g.to(z.scalar_type());
  }
  return loss;
}

class LinearCrossEntropyFn : public torch::autograd::Function<LinearCrossEntropyFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w,
                               const torch::Tensor& targets, const LinearCrossEntropyOptions& o) {
    const auto cdt = matmul_dtype(h);
    const auto sdt = stat_dtype(cdt);
    auto hc = h.to(cdt).contiguous();
    // Inside the trainer's scope the head's weight (the tied embedding's, fp32) is read from its
    // bf16 shadow, which the optimizer keeps current (model/weight_shadow.h), instead of cast anew
    // each forward: 37 µs a step at vocab 32768 × 768 on an H200 (docs/perf.md, stop 89).
    const bool shadowed = WeightGradInPlaceScope::active() && w.is_cuda() && w.dim() == 2 &&
                          w.scalar_type() == torch::kFloat32 && (cdt == torch::kBFloat16 || cdt == torch::kHalf);
    auto wc = shadowed ? shadowed_weight_blocks({w}, cdt) : w.to(cdt).contiguous();
    const int64_t N = hc.size(0), V = wc.size(0);
    auto dh = torch::empty_like(hc);
    // Written by the first chunk's product (no zero fill), added to by the others.
    auto dw = torch::empty(wc.sizes(), wc.options().dtype(sdt));
    auto loss_sum = torch::zeros({}, hc.options().dtype(sdt));
    const int64_t rows = rows_per_chunk(N, V, static_cast<int64_t>(c10::elementSize(cdt)), o);
    // In a CUDA-graph step's scope, the chunks' three GEMMs skip cuBLAS's workspace as the linear
    // layers' do (model/mixed_linear.h): no semaphore memset nodes in the graph.
    const bool no_workspace = WeightGradInPlaceScope::without_workspace() && hc.is_cuda();
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t n = std::min(rows, N - r0);
      auto hr = hc.narrow(0, r0, n);
      auto z = product(hr, wc, /*b_trans=*/true, no_workspace);
      torch::Tensor dz;
      loss_sum += chunk_loss(z, targets.narrow(0, r0, n), o, &dz).sum().to(sdt);
      auto dh_rows = dh.narrow(0, r0, n);
      product_into(dh_rows, dz, wc, /*b_trans=*/false, no_workspace);
      // dw (+)= dzᵀ hr, accumulated in fp32
      at_b_into_(dw, dz, hr, /*accumulate=*/r0 > 0, no_workspace);
    }
    if (N == 0) dw.zero_();
    auto count = (targets >= 0).sum().to(sdt).clamp_min(1);
    ctx->save_for_backward({dh, dw, count});
    ctx->saved_data["h_dtype"] = static_cast<int64_t>(h.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    // In a WeightGradInPlaceScope the backward writes or adds w's gradient into w.grad itself
    // (model/mixed_linear.h): a tied embedding's lookup then adds its rows to it there.
    if (WeightGradInPlaceScope::active() && w.is_cuda() && w.is_leaf() && w.requires_grad() &&
        w.scalar_type() == dw.scalar_type())
      ctx->saved_data["w_in_place"] = w;
    return loss_sum / count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto h_dtype = static_cast<at::ScalarType>(ctx->saved_data["h_dtype"].toInt());
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    auto scale = grads[0].to(saved[2].scalar_type()) / saved[2];  // d(mean)/d(Σ) × incoming
    auto dh = (saved[0] * scale.to(saved[0].scalar_type())).to(h_dtype);
    if (ctx->saved_data.count("w_in_place")) {
      auto w = ctx->saved_data["w_in_place"].toTensor();
      at::Tensor& grad = w.mutable_grad();
      if (!grad.defined()) grad = saved[1] * scale;
      else grad.addcmul_(saved[1], scale.to(grad.scalar_type()));
      return {dh, torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    auto dw = (saved[1] * scale).to(w_dtype);
    return {dh, dw, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear_cross_entropy(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& targets,
                                   const LinearCrossEntropyOptions& opts) {
  TORCH_CHECK(h.dim() == 2 && w.dim() == 2 && h.size(1) == w.size(1), "linear_cross_entropy: h ", h.sizes(),
              " and w ", w.sizes(), " do not match");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == h.size(0), "linear_cross_entropy: targets ", targets.sizes(),
              " for ", h.size(0), " rows");
  const bool needs_grad = torch::GradMode::is_enabled() && (h.requires_grad() || w.requires_grad());
  if (needs_grad) return LinearCrossEntropyFn::apply(h, w, targets, opts);
  // Evaluation: the same chunks, losses only.
  const auto cdt = matmul_dtype(h);
  const auto sdt = stat_dtype(cdt);
  auto hc = h.to(cdt), wc = w.to(cdt);
  const int64_t N = hc.size(0), rows = rows_per_chunk(N, wc.size(0), static_cast<int64_t>(c10::elementSize(cdt)), opts);
  auto loss_sum = torch::zeros({}, hc.options().dtype(sdt));
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    auto z = torch::mm(hc.narrow(0, r0, n), wc.t());
    loss_sum += chunk_loss(z, targets.narrow(0, r0, n), opts, nullptr).sum().to(sdt);
  }
  return loss_sum / (targets >= 0).sum().to(sdt).clamp_min(1);
}

torch::Tensor linear_cross_entropy_reference(const torch::Tensor& h, const torch::Tensor& w,
                                             const torch::Tensor& targets, double softcap) {
  const auto cdt = matmul_dtype(h);
  auto z = torch::matmul(h.to(cdt), w.to(cdt).t()).to(stat_dtype(cdt));
  if (softcap > 0) z = softcap * torch::tanh(z / softcap);
  return torch::nn::functional::cross_entropy(z, targets,
                                              torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
}

}  // namespace model
