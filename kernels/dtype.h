// The element types the training kernels take, named without torch or CUDA headers so launchers'
// headers stay plain C++. model/ maps at::ScalarType onto these (model/kernel_dtype.h).
#pragma once

namespace kernels {

enum class DType : int { F32 = 0, BF16 = 1, F16 = 2 };

}  // namespace kernels
