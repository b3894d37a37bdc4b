// The Gated DeltaNet's short conv kernels alone (kernels/short_conv.h) at a hybrid preset's shapes:
// one packed row of 16384 tokens (documents of 1 to 1500 tokens), the q|k|v parts of `base` or
// `moe-1b`, x a column slice of rows as wide as the layer's projection. Outputs are checked against
// a reference kernel with one thread per output, then timed with CUDA events (best and mean of
// three rounds). With -DSCB_OLD it also runs another commit's kernels, compiled into namespace
// oldk, for a before/after in one binary. On the GPU machine, in the repository root:
//   NV="nvcc -std=c++17 -O3 -arch=sm_90 -DDD_HAVE_CUDA"
//   $NV -I. scripts/gpu/short_conv_bench.cu kernels/short_conv.cu -o short_conv_bench
//   ./short_conv_bench base 50 && ./short_conv_bench moe-1b 30          # preset, repetitions
// Before/after, with `git worktree add .before <commit>` (carry .before too):
//   $NV -I.before -Dkernels=oldk -c .before/kernels/short_conv.cu -o old.o
//   $NV -I. -DSCB_OLD -c scripts/gpu/short_conv_bench.cu -o bench.o && $NV -I. -c kernels/short_conv.cu -o new.o
//   $NV bench.o old.o new.o -o short_conv_bench
// The older commit's backward is called once per part (the API before the parts came in one launch).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/short_conv.h"

#ifdef SCB_OLD
namespace oldk {
enum class DType : int { F32 = 0, BF16 = 1, F16 = 2 };
int short_conv_forward(void* y, const void* x, DType dt, const float* w, const int64_t* pos, int64_t R, int64_t T,
                       int64_t C, int64_t ld, int W, void* stream);
int short_conv_backward(void* dx, float* dw, const void* dy, const void* x, DType dt, const float* w,
                        const int64_t* pos, int64_t R, int64_t T, int64_t C, int64_t ld, int W, void* stream,
                        int64_t ld_dx);
}  // namespace oldk
#endif

namespace {

using bf16 = __nv_bfloat16;

void check_cuda(cudaError_t e, int line) {
  if (e == cudaSuccess) return;
  std::printf("CUDA error %s at line %d\n", cudaGetErrorString(e), line);
  std::exit(1);
}
void check_launch(int e, int line) {
  if (e == 0) return;
  std::printf("launch refused (%d) at line %d\n", e, line);
  std::exit(1);
}
#define CHECK_CUDA(x) check_cuda((x), __LINE__)
#define CHECK_LAUNCH(x) check_launch((x), __LINE__)

// ---- the reference: MODEL.md §4's formulas, one output a thread, fp32 (dw's sums in fp64) ----

__device__ float sigmoid_ref(float s) { return 1.f / (1.f + expf(-s)); }

__device__ float pre_activation(const bf16* x, const float* w, const int64_t* pos, int64_t t, int64_t c, int64_t ld,
                                int W) {
  float s = 0.f;
  for (int i = 0; i < W; ++i)
    if (t - i >= 0 && pos[t] >= i) s += w[c * W + W - 1 - i] * __bfloat162float(x[(t - i) * ld + c]);
  return s;
}

// ds = dy · silu'(s) at token t, channel c (dy fp32 [T, C]).
__device__ float pre_activation_grad(const float* dy, const bf16* x, const float* w, const int64_t* pos, int64_t t,
                                     int64_t c, int64_t C, int64_t ld, int W) {
  const float s = pre_activation(x, w, pos, t, c, ld, W), g = sigmoid_ref(s);
  return dy[t * C + c] * g * (1.f + s * (1.f - g));
}

__global__ void forward_ref(float* y, const bf16* x, const float* w, const int64_t* pos, int64_t T, int64_t C,
                            int64_t ld, int W) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * C) return;
  const float s = pre_activation(x, w, pos, i / C, i % C, ld, W);
  y[i] = s * sigmoid_ref(s);
}

__global__ void dx_ref(float* dx, const float* dy, const bf16* x, const float* w, const int64_t* pos, int64_t T,
                       int64_t C, int64_t ld, int W) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * C) return;
  const int64_t t = i / C, c = i % C;
  float g = 0.f;
  for (int k = 0; k < W; ++k)
    if (t + k < T && pos[t + k] >= k) g += pre_activation_grad(dy, x, w, pos, t + k, c, C, ld, W) * w[c * W + W - 1 - k];
  dx[i] = g;
}

__global__ void dw_ref(float* dw, const float* dy, const bf16* x, const float* w, const int64_t* pos, int64_t T,
                       int64_t C, int64_t ld, int W) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= C * W) return;
  const int64_t c = i / W;
  const int tap = W - 1 - static_cast<int>(i % W);  // weight column W − 1 − tap reaches tap tokens back
  double sum = 0;
  for (int64_t t = tap; t < T; ++t)
    if (pos[t] >= tap) sum += pre_activation_grad(dy, x, w, pos, t, c, C, ld, W) * __bfloat162float(x[(t - tap) * ld + c]);
  dw[i] = static_cast<float>(sum);
}

// ---- host helpers ----

template <typename T>
T* device_copy(const std::vector<T>& h) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, h.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
T* device_zeros(size_t n) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * sizeof(T)));
  CHECK_CUDA(cudaMemset(d, 0, n * sizeof(T)));
  return d;
}

// Columns [0, cols) of rows × ld device values, as fp32.
std::vector<float> host_columns(const bf16* d, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<bf16> h(rows * ld);
  CHECK_CUDA(cudaMemcpy(h.data(), d, h.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = __bfloat162float(h[r * ld + c]);
  return out;
}

std::vector<float> host_floats(const float* d, size_t n) {
  std::vector<float> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// max |got − want| / max |want|.
double max_rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::fmax(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::fmax(scale, std::fabs(static_cast<double>(want[i])));
  }
  return err / (scale > 0 ? scale : 1);
}

template <typename F>
void time_it(const char* name, F run, int reps, double bytes) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 5; ++i) run();
  float best = 1e30f, total = 0;
  for (int round = 0; round < 3; ++round) {
    cudaEventRecord(start);
    for (int i = 0; i < reps; ++i) run();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    ms /= reps;
    best = std::fmin(best, ms);
    total += ms;
  }
  std::printf("  %-32s %.4f ms (mean %.4f)  %5.0f GB/s\n", name, best, total / 3, bytes / best / 1e6);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "base";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 50;
  if (preset != "base" && preset != "moe-1b") {
    std::printf("usage: short_conv_bench base|moe-1b [repetitions]\n");
    return 2;
  }
  const int64_t T = 16384;
  const int W = 4;
  // q | k | v (H·dk, H·dk, H·2dk), then the output gate's H·2dk columns of the projection's rows.
  const std::vector<int64_t> widths =
      preset == "base" ? std::vector<int64_t>{576, 576, 1152} : std::vector<int64_t>{768, 768, 1536};
  const int64_t C = widths[0] + widths[1] + widths[2], ld = C + widths[2];

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> doc_length(1, 1500);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0, start = 0, next = doc_length(rng); t < T; ++t) {
    if (t == next) start = t, next = t + doc_length(rng);
    pos[t] = t - start;
  }
  std::vector<bf16> x_h(T * ld);
  for (auto& v : x_h) v = __float2bfloat16(normal(rng));
  std::vector<float> w_h(C * W);
  for (auto& v : w_h) v = 0.5f * normal(rng);
  std::vector<float> dy_h(T * C);  // the whole conv's output gradient, values bf16 can hold
  for (auto& v : dy_h) v = __bfloat162float(__float2bfloat16(normal(rng)));

  bf16* x = device_copy(x_h);
  float* w = device_copy(w_h);
  float* dy_full = device_copy(dy_h);
  int64_t* p = device_copy(pos);
  std::vector<bf16*> dy_parts;  // each part's gradient on its own, as autograd hands them over
  std::vector<kernels::ShortConvGradPart> parts;
  for (int64_t i = 0, c0 = 0; i < 3; c0 += widths[i], ++i) {
    std::vector<bf16> h(T * widths[i]);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < widths[i]; ++c) h[t * widths[i] + c] = __float2bfloat16(dy_h[t * C + c0 + c]);
    dy_parts.push_back(device_copy(h));
    parts.push_back({dy_parts.back(), c0, widths[i]});
  }
  bf16* y = device_zeros<bf16>(T * C);
  bf16* dx = device_zeros<bf16>(T * ld);
  float* dw = device_zeros<float>(C * W);
  float* y_ref = device_zeros<float>(T * C);
  float* dx_ref_d = device_zeros<float>(T * C);
  float* dw_ref_d = device_zeros<float>(C * W);
  forward_ref<<<(T * C + 255) / 256, 256>>>(y_ref, x, w, p, T, C, ld, W);
  dx_ref<<<(T * C + 255) / 256, 256>>>(dx_ref_d, dy_full, x, w, p, T, C, ld, W);
  dw_ref<<<(C * W + 127) / 128, 128>>>(dw_ref_d, dy_full, x, w, p, T, C, ld, W);
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto y_want = host_floats(y_ref, T * C), dx_want = host_floats(dx_ref_d, T * C),
             dw_want = host_floats(dw_ref_d, C * W);

  auto forward = [&] {
    CHECK_LAUNCH(kernels::short_conv_forward(y, x, kernels::DType::BF16, w, p, 1, T, C, ld, W, nullptr));
  };
  auto backward = [&] {
    CHECK_LAUNCH(kernels::short_conv_backward_parts(dx, dw, parts.data(), 3, x, kernels::DType::BF16, w, p, 1, T, ld, W,
                                                    nullptr, ld));
  };
  auto check = [&](const char* what, auto run_forward, auto run_backward) {
    CHECK_CUDA(cudaMemset(dw, 0, C * W * sizeof(float)));
    run_forward();
    run_backward();
    CHECK_CUDA(cudaDeviceSynchronize());
    std::printf("%s %s: C %lld, ld %lld; max error / max |reference|: y %.1e, dx %.1e, dw %.1e\n", preset.c_str(), what,
                static_cast<long long>(C), static_cast<long long>(ld),
                max_rel_error(host_columns(y, T, C, C), y_want), max_rel_error(host_columns(dx, T, C, ld), dx_want),
                max_rel_error(host_floats(dw, C * W), dw_want));
  };
  check("kernels", forward, backward);
  const double forward_bytes = 2.0 * T * C * sizeof(bf16), backward_bytes = 3.0 * T * C * sizeof(bf16);
#ifdef SCB_OLD
  auto old_forward = [&] {
    CHECK_LAUNCH(oldk::short_conv_forward(y, x, oldk::DType::BF16, w, p, 1, T, C, ld, W, nullptr));
  };
  auto old_backward = [&] {  // one launch a part
    for (const auto& part : parts)
      CHECK_LAUNCH(oldk::short_conv_backward(dx + part.c0, dw + part.c0 * W, part.dy, x + part.c0, oldk::DType::BF16,
                                             w + part.c0 * W, p, 1, T, part.C, ld, W, nullptr, ld));
  };
  check("older kernels", old_forward, old_backward);
#endif
  for (int round = 0; round < 2; ++round) {
    time_it("forward", forward, reps, forward_bytes);
    time_it("backward, parts in one launch", backward, reps, backward_bytes);
#ifdef SCB_OLD
    time_it("older forward", old_forward, reps, forward_bytes);
    time_it("older backward, a launch a part", old_backward, reps, backward_bytes);
#endif
  }
  return 0;
}
