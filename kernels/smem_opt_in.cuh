// The opt-in to more than 48 KiB of dynamic shared memory, per device.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

namespace kernels {

// Allows `kernel` `bytes` of dynamic shared memory on the current device. The attribute belongs to
// one device, and the trainer drives several GPUs from the rank threads of one process: an opt-in
// made once per process leaves the other GPUs at the 48 KiB default, where the launch fails. Each
// (kernel, device) keeps the largest size allowed so far, raised when a launch asks for more and
// never lowered (a kernel taking its size at run time, such as one with dv as an argument, may ask
// for a large block, then a small one, then the large one again); any thread. Returns the
// cudaError_t (0 = success); a refusal (a device whose opt-in limit is lower) is also cleared from
// the thread's last error, so the caller can fall back to another kernel.
inline int allow_dynamic_smem(const void* kernel, int bytes) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return static_cast<int>(err);
  }
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> allowed;  // (kernel, device) -> bytes
  std::lock_guard<std::mutex> lock(mu);
  const auto it = allowed.find({kernel, device});
  if (it != allowed.end() && it->second >= bytes) return 0;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return static_cast<int>(err);
  }
  allowed[{kernel, device}] = bytes;
  return 0;
}

}  // namespace kernels
