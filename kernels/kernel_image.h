// Whether this build's CUDA kernels can run on a GPU. deltadeck_kernels is compiled for one
// architecture (DD_KERNEL_ARCH, 90: sm_90 code and compute_90 PTX, kernels/CMakeLists.txt): GPUs
// of that compute capability run the code, newer ones compile the PTX when it loads, and older
// ones (Ampere, Ada) have no image, where the first launch would fail inside a training step. The
// trainer asks before a run starts (trainer::check_device). Only the GPU's compute capability is
// read: no context is created and the current device is left alone.
#pragma once

namespace kernels {

#ifdef DD_HAVE_CUDA
// 0 when the kernels run on GPU `device`; cudaErrorNoKernelImageForDevice for a GPU of a lower
// compute capability than they were compiled for; else the cudaError_t of reading it (an invalid
// index).
int kernel_image_status(int device);
// kernel_image_status(device) is cudaErrorNoKernelImageForDevice.
bool kernel_image_missing(int device);
// The compute capability the kernels were compiled for, major · 10 + minor (90).
int kernel_arch();
#endif

}  // namespace kernels
