// RMSNorm reference: plain loops, double accumulators.
#include "kernels/rmsnorm.h"

#include <cmath>

namespace kernels {

void rmsnorm_forward_ref(float* out, const float* x, const float* w, int64_t N, int64_t C, double eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* row = x + n * C;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(row[c]) * row[c];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    for (int64_t c = 0; c < C; ++c)
      out[n * C + c] = static_cast<float>(row[c] * inv * (w ? w[c] : 1.0));
  }
}

}  // namespace kernels
