// The opt-in to more than 48 KiB of dynamic shared memory, per device.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <tuple>

namespace kernels {

// Allows `kernel` `bytes` of dynamic shared memory on the current device. The attribute belongs to
// one device, and the trainer drives several GPUs from the rank threads of one process: an opt-in
// made once per process leaves the other GPUs at the 48 KiB default, where the launch fails. Each
// (kernel, device, bytes) is set once; any thread. Returns the cudaError_t (0 = success); a refusal
// (a device whose opt-in limit is lower) is also cleared from the thread's last error, so the caller
// can fall back to another kernel.
inline int allow_dynamic_smem(const void* kernel, int bytes) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return static_cast<int>(err);
  }
  static std::mutex mu;
  static std::set<std::tuple<const void*, int, int>> done;
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, device, bytes}) != 0) return 0;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return static_cast<int>(err);
  }
  done.insert({kernel, device, bytes});
  return 0;
}

}  // namespace kernels
