// The device a run trains on: choosing it from run.devices, describing it, its memory counters,
// RNG state and the peak throughput MFU is measured against.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "trainer/api.h"

namespace trainer {

// Problems with run.devices and train.precision on this machine (no GPU, an index out of range, a
// GPU our kernels have no image for (before compute capability 9.0: kernels/kernel_image.h),
// fp16/fp8 on the CPU, fp8 before compute capability 8.9). Empty = runnable.
std::vector<std::string> check_device(const RunConfig& cfg);

// train.precision "auto" made concrete for the devices run.devices names here: "bf16" when each is
// a GPU of compute capability 8.0 or newer (bf16 tensor cores), else "fp32". Other values are left
// as they are. Call after check_device passed.
void resolve_precision(RunConfig& cfg);

// One device per rank, as run.devices names them on this machine: "auto" = GPU 0 when CUDA has
// one, else the CPU; "cpu" = one CPU rank; "cpu:N" = N CPU ranks; "all" = every GPU; "0,2" = those
// GPUs. Call after check_device passed; throws std::runtime_error naming run.devices otherwise.
std::vector<c10::Device> rank_devices(const std::string& devices);

// Makes `device` the calling thread's current CUDA device (no-op for the CPU).
void bind_thread(const c10::Device& device);

// Loads LibTorch's lazily loaded CUDA libraries once, before rank threads start (their loader is not
// thread-safe). No-op for the CPU.
void preload_cuda_libraries(const c10::Device& device);

// "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3, 79.1 GiB, sm_90)".
std::string describe_device(const c10::Device& device);

// Dense peak TFLOP/s of the device for the precision (fp8 products, else bf16), from a table of
// known GPUs; 0 when unknown or the CPU.
double known_peak_tflops(const c10::Device& device, const std::string& precision);

struct DeviceMemory {
  double allocated_gib = 0, reserved_gib = 0, peak_gib = 0;  // peak allocated since the last reset
};
// The caching allocator's counters; all zero on the CPU. reset_peak starts a new peak window.
DeviceMemory device_memory(const c10::Device& device, bool reset_peak);

// The device generator's state (undefined on the CPU, whose generator is saved separately) and
// its restore.
at::Tensor device_rng_state(const c10::Device& device);
void set_device_rng_state(const c10::Device& device, const at::Tensor& state);

}  // namespace trainer
