#include "model/linear.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cmath>

#include "model/fp8_linear.h"
#include "model/mixed_linear.h"

#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>

#include "kernels/gemm_accumulate.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {
thread_local bool fp8_active = false;
}  // namespace

LinearImpl::LinearImpl(int64_t in, int64_t out) {
  weight = register_parameter("weight", torch::empty({out, in}));
  reset_parameters();
}

void LinearImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  const double bound = 1.0 / std::sqrt(static_cast<double>(weight.size(1)));
  weight.uniform_(-bound, bound);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (fp8_active && fp8_linear_fits(x, weight)) return fp8_linear(x, weight, &fp8);
  if (mixed_linear_applies(x, weight)) return mixed_linear(x, weight, at::autocast::get_autocast_dtype(at::kCUDA));
  return torch::linear(x, weight);
}

torch::Tensor linear_cat(const torch::Tensor& x, const std::vector<Linear>& layers) {
  TORCH_CHECK(!layers.empty(), "linear_cat: no layers");
  std::vector<torch::Tensor> weights;
  for (const auto& l : layers) weights.push_back(l->weight);
  // FP8 reads the weights where they are; the plain product concatenates them.
  if (fp8_active && fp8_linear_fits(x, weights)) return fp8_linear(x, weights, &layers.front().ptr()->fp8);
  if (mixed_linear_applies(x, weights)) return mixed_linear(x, weights, at::autocast::get_autocast_dtype(at::kCUDA));
  return torch::linear(x, weights.size() == 1 ? weights[0] : torch::cat(weights, 0));
}

std::vector<torch::Tensor> linear_cat_split(const torch::Tensor& x, const std::vector<Linear>& layers) {
  TORCH_CHECK(!layers.empty(), "linear_cat_split: no layers");
  std::vector<torch::Tensor> weights;
  std::vector<int64_t> outs;
  for (const auto& l : layers) {
    weights.push_back(l->weight);
    outs.push_back(l->weight.size(0));
  }
  if (fp8_active && fp8_linear_fits(x, weights)) return fp8_linear_split(x, weights, &layers.front().ptr()->fp8);
  if (mixed_linear_applies(x, weights))
    return mixed_linear(x, weights, at::autocast::get_autocast_dtype(at::kCUDA)).split_with_sizes(outs, -1);
  return torch::linear(x, weights.size() == 1 ? weights[0] : torch::cat(weights, 0)).split_with_sizes(outs, -1);
}

std::vector<torch::Tensor> linear_cat_groups(const torch::Tensor& x, const std::vector<std::vector<Linear>>& groups,
                                             bool one_product) {
  TORCH_CHECK(!groups.empty(), "linear_cat_groups: no groups");
  std::vector<torch::Tensor> weights;
  std::vector<int64_t> sizes, columns;
  for (const auto& g : groups) {
    TORCH_CHECK(!g.empty(), "linear_cat_groups: an empty group");
    int64_t cols = 0;
    for (const auto& l : g) {
      weights.push_back(l->weight);
      cols += l->weight.size(0);
    }
    sizes.push_back(static_cast<int64_t>(g.size()));
    columns.push_back(cols);
  }
  if (!fp8_active && mixed_linear_applies(x, weights)) {
    const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    if (one_product) return mixed_linear_split(x, weights, columns, dtype);
    return mixed_linear_groups(x, weights, sizes, dtype);
  }
  std::vector<torch::Tensor> out;
  for (const auto& g : groups) out.push_back(linear_cat(x, g));
  return out;
}

std::vector<torch::Tensor> linear_cat_columns(const torch::Tensor& x, const std::vector<std::vector<Linear>>& groups,
                                              const std::vector<int64_t>& split_sizes) {
  TORCH_CHECK(!groups.empty(), "linear_cat_columns: no groups");
  // Each group's splits: the consecutive split sizes that add up to its rows.
  std::vector<std::vector<int64_t>> group_splits;
  std::vector<torch::Tensor> weights;
  size_t next = 0;
  for (const auto& g : groups) {
    TORCH_CHECK(!g.empty(), "linear_cat_columns: an empty group");
    int64_t cols = 0, taken = 0;
    for (const auto& l : g) {
      weights.push_back(l->weight);
      cols += l->weight.size(0);
    }
    std::vector<int64_t> mine;
    while (taken < cols && next < split_sizes.size()) {
      TORCH_CHECK(split_sizes[next] > 0, "linear_cat_columns: every split needs a column, got split sizes ",
                  split_sizes);
      taken += split_sizes[next];
      mine.push_back(split_sizes[next++]);
    }
    TORCH_CHECK(taken == cols, "linear_cat_columns: split sizes ", split_sizes,
                " do not fall on the groups' boundaries (a group of ", cols, " rows)");
    group_splits.push_back(std::move(mine));
  }
  TORCH_CHECK(next == split_sizes.size(), "linear_cat_columns: split sizes ", split_sizes,
              " go past the groups' rows");
  if (!fp8_active && mixed_linear_applies(x, weights))
    return mixed_linear_split(x, weights, split_sizes, at::autocast::get_autocast_dtype(at::kCUDA));
  const auto outs = linear_cat_groups(x, groups);
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (group_splits[i].size() == 1) {
      parts.push_back(outs[i]);
      continue;
    }
    for (auto& p : outs[i].split_with_sizes(group_splits[i], -1)) parts.push_back(p);
  }
  return parts;
}

std::vector<std::pair<std::string, Fp8History*>> fp8_histories(torch::nn::Module& model) {
  std::vector<std::pair<std::string, Fp8History*>> out;
  for (auto& item : model.named_modules()) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    if (linear && linear->fp8.records.defined()) out.emplace_back(item.key(), &linear->fp8);
  }
  return out;
}

void add_at_b_(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b) { at_b_into_(c, a, b, true); }

torch::Tensor product(const torch::Tensor& a, const torch::Tensor& b, bool b_trans, bool no_workspace) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == (b_trans ? b.size(1) : b.size(0)), "product: a ",
              a.sizes(), (b_trans ? " · bᵀ with b " : " · b with b "), b.sizes());
  auto c = torch::empty({a.size(0), b_trans ? b.size(0) : b.size(1)}, a.options());
  product_into(c, a, b, b_trans, no_workspace);
  return c;
}

void product_into(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b, bool b_trans, bool no_workspace,
                  bool accumulate) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "product_into: c, a and b must be 2-D, got ", c.sizes(),
              ", ", a.sizes(), ", ", b.sizes());
  const int64_t N = b.size(b_trans ? 0 : 1);
  TORCH_CHECK(a.size(1) == (b_trans ? b.size(1) : b.size(0)) && c.size(0) == a.size(0) && c.size(1) == N,
              "product_into: c ", c.sizes(), " = a ", a.sizes(), (b_trans ? " · bᵀ with b " : " · b with b "),
              b.sizes());
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (no_workspace && a.is_cuda() && b.device() == a.device() && c.device() == a.device() &&
      a.scalar_type() == b.scalar_type() && c.scalar_type() == a.scalar_type() && kernel_dtype(a.scalar_type(), dt) &&
      dt != kernels::DType::F32 && a.is_contiguous() && b.is_contiguous() && c.stride(1) == 1 && a.size(1) > 0) {
    const int64_t M = a.size(0), K = a.size(1);
    const int status = kernels::gemm_rowmajor(at::cuda::getCurrentCUDABlasHandle(), c.data_ptr(), dt, c.stride(0),
                                              a.data_ptr(), K, /*a_trans=*/false, b.data_ptr(), b.size(1), b_trans, dt,
                                              M, N, K, accumulate, /*no_workspace=*/true);
    TORCH_CHECK(status == 0, "product: cublasGemmEx failed (status ", status, ")");
    return;
  }
#endif
  (void)no_workspace;
  const auto bb = b_trans ? b.t() : b;
  if (accumulate) c.addmm_(a, bb);
  else torch::mm_out(c, a, bb);
}

void at_b_into_(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b, bool accumulate, bool no_workspace) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2 && a.size(0) == b.size(0) && c.size(0) == a.size(1) &&
                  c.size(1) == b.size(1),
              "at_b_into_: c ", c.sizes(), (accumulate ? " +=" : " ="), " aᵀ b with a ", a.sizes(), ", b ", b.sizes());
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  const bool fits = c.is_cuda() && c.scalar_type() == torch::kFloat32 && c.stride(1) == 1 &&
                    a.scalar_type() == b.scalar_type() && kernel_dtype(a.scalar_type(), dt) &&
                    dt != kernels::DType::F32 && a.stride(1) == 1 && b.stride(1) == 1 && a.device() == c.device() &&
                    b.device() == c.device() && a.size(0) > 0;
  if (fits) {
    const int status = kernels::gemm_rowmajor(at::cuda::getCurrentCUDABlasHandle(), c.data_ptr<float>(),
                                              kernels::DType::F32, c.stride(0), a.data_ptr(), a.stride(0),
                                              /*a_trans=*/true, b.data_ptr(), b.stride(0), /*b_trans=*/false, dt,
                                              a.size(1), b.size(1), a.size(0), accumulate, no_workspace);
    TORCH_CHECK(status == 0, "at_b_into_: cublasGemmEx failed (status ", status, ")");
    return;
  }
#endif
  (void)no_workspace;
  auto ab = torch::mm(a.t(), b).to(c.scalar_type());
  if (accumulate) c.add_(ab);
  else c.copy_(ab);
}

Fp8Scope::Fp8Scope(bool on) : was_active_(fp8_active) { fp8_active = on; }
Fp8Scope::~Fp8Scope() { fp8_active = was_active_; }
bool Fp8Scope::active() { return fp8_active; }

}  // namespace model
