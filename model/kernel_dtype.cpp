#include "model/kernel_dtype.h"

#include <c10/util/Exception.h>

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

namespace model {

kernels::DType checked_kernel_dtype(c10::ScalarType t, const char* what) {
  kernels::DType d{};
  TORCH_CHECK(kernel_dtype(t, d), what, ": unsupported dtype ", t);
  return d;
}

void check_kernel_launch(int err, const char* what) {
  TORCH_CHECK(err == 0, what, ": kernel launch failed (cudaError ", err, ")");
}

#if defined(DD_HAVE_CUDA)
void* stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
#endif

}  // namespace model
