#include "kernels/kernel_image.h"

#include <cuda_runtime.h>

namespace kernels {

namespace {

__global__ void image_probe_kernel() {}

}  // namespace

int kernel_image_status(int device) {
  int previous = 0;
  cudaError_t err = cudaGetDevice(&previous);
  if (err == cudaSuccess) err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return static_cast<int>(err);
  }
  cudaFuncAttributes attributes{};
  err = cudaFuncGetAttributes(&attributes, image_probe_kernel);
  (void)cudaGetLastError();  // a missing image is sticky in the thread's last error otherwise
  (void)cudaSetDevice(previous);
  return static_cast<int>(err);
}

}  // namespace kernels
