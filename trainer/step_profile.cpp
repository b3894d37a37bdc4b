#include "trainer/step_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <regex>
#include <vector>

namespace trainer {

namespace {

namespace prof = torch::profiler::impl;

std::set<prof::ActivityType> activities(bool gpu) {
  if (gpu) return {prof::ActivityType::CPU, prof::ActivityType::CUDA};
  return {prof::ActivityType::CPU};
}

prof::ProfilerConfig config(bool shapes) { return prof::ProfilerConfig(prof::ProfilerState::KINETO, shapes, false); }

}  // namespace

std::string profile_component_of(const std::string& name) {
  // In order: the first rule that matches names the component. The delta rule's come before the
  // libraries' (one of its kernels is a "gemm"), matmul before FP8 (a library's fp8 GEMM is a
  // matmul), and the gradient-norm rule before the norms'.
  static const std::vector<std::pair<std::regex, std::string>> rules = {
      {std::regex("nccl", std::regex::icase), "communication (NCCL)"},
      {std::regex("flash|fmha|attention|sdpa|cudnn::fusion|qkv_tma_setup", std::regex::icase), "attention"},
      {std::regex("gdr_|state_grads|unit_lower_inverse|gemm_tf32x3|row_dot"), "Gated DeltaNet: delta rule"},
      {std::regex("short_conv|gates_forward|gates_backward"), "Gated DeltaNet: short conv, gates"},
      {std::regex("moe_|router_|order_count|order_scan|order_place|scatter_block_grads|expert_grad_pieces|gather_rows"),
       "MoE routing and combine"},
      {std::regex("gemm|cutlass|xmma|nvjet|sm90_|cublas|matmul", std::regex::icase), "matmul"},
      {std::regex("quantize|amax|fp8", std::regex::icase), "FP8 quantisation"},  // after matmul: fp8 GEMMs
      {std::regex("ce_grad", std::regex::icase), "cross-entropy kernel"},
      {std::regex("adam|muon", std::regex::icase), "optimizer"},
      {std::regex("LpNorm|foreach_norm"), "gradient norm (clipping)"},
      {std::regex("rope", std::regex::icase), "RoPE (with QK-norm)"},
      {std::regex("swiglu", std::regex::icase), "SwiGLU"},
      {std::regex("norm", std::regex::icase), "norms (RMSNorm, gated, L2)"},
      {std::regex("reduce|column_sum|sum_functor", std::regex::icase), "reductions (sums)"},
      {std::regex("cat|copy|index|gather|scatter|embedding|cast|sort|zero_|named_rows", std::regex::icase),
       "copies, casts, indexing"},
      {std::regex("memset|memcpy", std::regex::icase), "memset / memcpy"},
      {std::regex("elementwise|vectorized|unrolled|foreach", std::regex::icase), "elementwise (ATen)"},
  };
  for (const auto& [re, label] : rules)
    if (std::regex_search(name, re)) return label;
  return "other";
}

std::unique_ptr<StepProfile> StepProfile::start(int gpu_index, bool shapes) {
  const bool gpu = gpu_index >= 0;
  std::unique_ptr<StepProfile> p(new StepProfile());
  p->gpu_index_ = gpu_index;
  torch::autograd::profiler::prepareProfiler(config(shapes), activities(gpu));
  torch::autograd::profiler::enableProfiler(config(shapes), activities(gpu));
  p->running_ = true;
  return p;
}

StepProfile::~StepProfile() {
  if (running_) torch::autograd::profiler::disableProfiler();
}

std::string StepProfile::stop(const std::string& trace_path, int64_t steps, double wall_ms_per_step, int64_t top) {
  auto result = torch::autograd::profiler::disableProfiler();
  running_ = false;
  if (!trace_path.empty()) result->save(trace_path);
  if (gpu_index_ < 0) {
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "profile of %lld steps on the CPU: %.2f ms per step; the breakdown covers GPU kernels only, "
                  "the CPU ops are in the trace (--profile-trace)\n",
                  static_cast<long long>(steps), wall_ms_per_step);
    return msg;
  }
  struct Sum {
    double ms = 0;
    int64_t count = 0;
  };
  std::map<std::string, Sum> by_kernel, by_component;
  double gpu_ms = 0;
  // Kernels of this rank's GPU; should the profiler tag them otherwise, every GPU kernel.
  bool tagged = false;
  for (const auto& e : result->events())
    tagged = tagged || (e.deviceType() == c10::DeviceType::CUDA && e.deviceIndex() == gpu_index_);
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA || (tagged && e.deviceIndex() != gpu_index_)) continue;
    const double ms = static_cast<double>(e.durationNs()) / 1e6;
    const std::string name = e.name();
    by_kernel[name].ms += ms;
    by_kernel[name].count += 1;
    by_component[profile_component_of(name)].ms += ms;
    by_component[profile_component_of(name)].count += 1;
    gpu_ms += ms;
  }
  const double n = static_cast<double>(std::max<int64_t>(1, steps));
  auto sorted = [](const std::map<std::string, Sum>& m) {
    std::vector<std::pair<std::string, Sum>> v(m.begin(), m.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    return v;
  };
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "profile of %lld steps: %.2f ms wall per step, %.2f ms of GPU kernels per step (%.0f%% busy)\n\n"
                "| component | ms / step | share of step | kernels / step |\n|---|---|---|---|\n",
                static_cast<long long>(steps), wall_ms_per_step, gpu_ms / n,
                wall_ms_per_step > 0 ? 100.0 * gpu_ms / n / wall_ms_per_step : 0.0);
  out += line;
  for (const auto& [c, s] : sorted(by_component)) {
    std::snprintf(line, sizeof line, "| %s | %.2f | %.1f%% | %.0f |\n", c.c_str(), s.ms / n,
                  wall_ms_per_step > 0 ? 100.0 * s.ms / n / wall_ms_per_step : 0.0, s.count / n);
    out += line;
  }
  std::snprintf(line, sizeof line, "| idle (launch gaps, host waits) | %.2f | %.1f%% | |\n",
                std::max(0.0, wall_ms_per_step - gpu_ms / n),
                wall_ms_per_step > 0 ? 100.0 * std::max(0.0, wall_ms_per_step - gpu_ms / n) / wall_ms_per_step : 0.0);
  out += line;
  std::snprintf(line, sizeof line, "\n| kernel (top %lld) | ms / step | calls / step |\n|---|---|---|\n",
                static_cast<long long>(top));
  out += line;
  int64_t shown = 0;
  for (const auto& [k, s] : sorted(by_kernel)) {
    if (shown++ == top) break;
    std::string name = k.size() > 170 ? k.substr(0, 167) + "..." : k;
    std::snprintf(line, sizeof line, "| `%s` | %.2f | %.0f |\n", name.c_str(), s.ms / n, s.count / n);
    out += line;
  }
  return out;
}

}  // namespace trainer
