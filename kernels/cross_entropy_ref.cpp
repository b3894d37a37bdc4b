#include <cmath>

#include "kernels/cross_entropy.h"

namespace kernels {

void cross_entropy_grad_inplace_ref(float* logits, float* loss, const int64_t* targets, int64_t N, int64_t V,
                                    double grad_scale) {
  for (int64_t n = 0; n < N; ++n) {
    float* z = logits + n * V;
    const int64_t t = targets[n];
    if (t < 0) {
      loss[n] = 0.f;
      for (int64_t j = 0; j < V; ++j) z[j] = 0.f;
      continue;
    }
    double m = z[0];
    for (int64_t j = 1; j < V; ++j) m = std::fmax(m, static_cast<double>(z[j]));
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(static_cast<double>(z[j]) - m);
    const double lse = m + std::log(s);
    loss[n] = static_cast<float>(lse - static_cast<double>(z[t]));
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(static_cast<double>(z[j]) - lse);
      z[j] = static_cast<float>((p - (j == t ? 1.0 : 0.0)) * grad_scale);
    }
  }
}

}  // namespace kernels
