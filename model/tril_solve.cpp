#include "model/tril_solve.h"

#include <torch/torch.h>

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/tril_inverse.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

torch::Tensor unit_lower_solve_reference(const torch::Tensor& A, const torch::Tensor& B) {
  return torch::linalg_solve_triangular(A, B, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class UnitLowerInverseFn : public torch::autograd::Function<UnitLowerInverseFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& A) {
    auto Ac = A.contiguous();
    const int64_t C = Ac.size(-1), R = Ac.numel() / (C * C);
    auto T = torch::empty_like(Ac);
    check_kernel_launch(kernels::unit_lower_inverse(T.data_ptr<float>(), Ac.data_ptr<float>(), R, C,
                                                    c10::cuda::getCurrentCUDAStream(A.device().index()).stream()),
                        "unit lower-triangular inverse");
    ctx->save_for_backward({T});
    return T;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto T = ctx->get_saved_variables()[0];
    auto Tt = T.transpose(-1, -2);
    // d(M⁻¹) = −M⁻¹ dM M⁻¹, so dA = −Tᵀ dT Tᵀ; only A's strict lower triangle was read.
    return {(-torch::matmul(Tt, torch::matmul(grads[0], Tt))).tril(-1)};
  }
};

bool kernel_takes(const torch::Tensor& A) {
  return A.is_cuda() && A.scalar_type() == torch::kFloat32 && A.dim() >= 2 && A.size(-1) == A.size(-2) &&
         kernels::unit_lower_inverse_supports(A.size(-1)) && A.numel() > 0;
}

}  // namespace
#endif

torch::Tensor unit_lower_inverse(const torch::Tensor& A) {
#if defined(DD_HAVE_CUDA)
  if (kernel_takes(A)) return UnitLowerInverseFn::apply(A);
#endif
  const int64_t C = A.size(-1);
  return unit_lower_solve_reference(A, torch::eye(C, A.options()).expand(A.sizes()));
}

torch::Tensor unit_lower_solve(const torch::Tensor& A, const torch::Tensor& B) {
#if defined(DD_HAVE_CUDA)
  if (kernel_takes(A) && B.scalar_type() == torch::kFloat32) return torch::matmul(UnitLowerInverseFn::apply(A), B);
#endif
  return unit_lower_solve_reference(A, B);
}

}  // namespace model
