// Whether this build's CUDA kernels can run on a GPU. They are compiled for compute capability 9.0
// (sm_90 code and compute_90 PTX, kernels/CMakeLists.txt): Hopper runs the code, newer GPUs JIT
// the PTX, and older ones (Ampere, Ada) have no image, where the first launch would fail deep in a
// training step. The trainer asks before a run starts (trainer::check_device).
#pragma once

namespace kernels {

#ifdef DD_HAVE_CUDA
// The cudaError_t of looking up a kernel of this library on GPU `device` (0 = it has an image
// there; cudaErrorNoKernelImageForDevice where it has none). Restores the calling thread's
// current device.
int kernel_image_status(int device);
#endif

}  // namespace kernels
