#include "kernels/kernel_image.h"

#include <cuda_runtime.h>

namespace kernels {

int kernel_arch() { return DD_KERNEL_ARCH; }

int kernel_image_status(int device) {
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // an invalid index is not left as this thread's last error
    return static_cast<int>(err);
  }
  return major * 10 + minor >= DD_KERNEL_ARCH ? 0 : static_cast<int>(cudaErrorNoKernelImageForDevice);
}

bool kernel_image_missing(int device) {
  return kernel_image_status(device) == static_cast<int>(cudaErrorNoKernelImageForDevice);
}

}  // namespace kernels
