// The bridge from torch dtypes to the kernels' DType, for the autograd wrappers of model/ that
// call kernels/. Only the dtypes the training kernels take map; the rest fall back to ATen.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "kernels/dtype.h"

namespace model {

// Whether `t` is one of the kernels' element types; sets `out` when it is.
inline bool kernel_dtype(c10::ScalarType t, kernels::DType& out) {
  switch (t) {
    case c10::ScalarType::Float: out = kernels::DType::F32; return true;
    case c10::ScalarType::BFloat16: out = kernels::DType::BF16; return true;
    case c10::ScalarType::Half: out = kernels::DType::F16; return true;
    default: return false;
  }
}

// The kernels' DType of `t`, for callers that checked it before (throws c10::Error naming `what`
// when it is not one of the kernels' types).
kernels::DType checked_kernel_dtype(c10::ScalarType t, const char* what);

// A kernel launcher's cudaError_t (0 = success) as a c10::Error naming the op.
void check_kernel_launch(int err, const char* what);

#if defined(DD_HAVE_CUDA)
// The current CUDA stream of t's device, as the launchers take it (a cudaStream_t). Any thread.
void* stream_of(const at::Tensor& t);
#endif

}  // namespace model
