#include "trainer/device.h"

#include <torch/torch.h>

#include <cstdio>
#include <stdexcept>

#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#if defined(DD_HAVE_CUDA)
#include "kernels/kernel_image.h"
#endif
#include "model/fp8_linear.h"

namespace trainer {

namespace {

int64_t gpu_count() { return torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0; }

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

std::string gpu_name(int index) {
#if defined(DD_HAVE_CUDA)
  return at::cuda::getDeviceProperties(index)->name;
#else
  (void)index;
  return "";
#endif
}

// The GPU indices of a list like "0,2" or "0, 2" (the config validation trims items, so this does
// too); an item that is not a number ends the list early (the validation reports those by key).
std::vector<int64_t> gpu_indices(const std::string& list) {
  std::vector<int64_t> out;
  size_t pos = 0;
  for (;;) {
    const size_t comma = list.find(',', pos);
    std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t first = item.find_first_not_of(" \t");
    item = first == std::string::npos ? "" : item.substr(first, item.find_last_not_of(" \t") - first + 1);
    if (!all_digits(item)) break;
    out.push_back(std::stoll(item));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> check_device(const RunConfig& cfg) {
  std::vector<std::string> errors;
  const std::string& d = cfg.run.devices;
  const int64_t gpus = gpu_count();
  bool on_gpu = false;
  std::vector<int64_t> indices;
  if (d == "auto") {
    on_gpu = gpus > 0;
  } else if (d == "cpu" || d.rfind("cpu:", 0) == 0) {
    on_gpu = false;  // cpu:N with N >= 1 is checked by the config validation
  } else if (d == "all") {
    if (gpus == 0) errors.push_back("run.devices: \"all\" asks for the GPUs but CUDA finds none (use \"cpu\")");
    on_gpu = true;
  } else {
    on_gpu = true;
    indices = gpu_indices(d);
    for (int64_t i : indices)
      if (i >= gpus)
        errors.push_back("run.devices: GPU " + std::to_string(i) + " does not exist (CUDA finds " +
                         std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs") + ")");
  }
  if (!errors.empty()) return errors;
#if defined(DD_HAVE_CUDA)
  if (on_gpu) {
    const int arch = kernels::kernel_arch();
    for (const auto& dev : rank_devices(d)) {
      if (kernels::kernel_image_missing(dev.index())) {
        errors.push_back("run.devices: " + describe_device(dev) + " cannot run deltadeck's CUDA kernels: this build " +
                         "compiled them for compute capability " + std::to_string(arch / 10) + "." +
                         std::to_string(arch % 10) + " (Hopper: H100, H200) (use \"cpu\", or a Hopper GPU)");
      }
    }
  }
  if (!errors.empty()) return errors;
#endif
  const std::string& p = cfg.train.precision;
  if (!on_gpu && (p == "fp16" || p == "fp8"))
    errors.push_back("train.precision: \"" + p + "\" needs a CUDA GPU and this run is on the CPU (use \"fp32\" or "
                     "\"bf16\")");
  if (on_gpu && p == "fp8") {
    for (const auto& dev : rank_devices(d)) {
      if (!model::fp8_supported(dev)) {
        errors.push_back("train.precision: \"fp8\" needs a GPU of compute capability 8.9 or newer (Ada, Hopper); " +
                         describe_device(dev) + " has none (use \"bf16\")");
        break;
      }
    }
  }
  return errors;
}

void resolve_precision(RunConfig& cfg) {
  if (cfg.train.precision != "auto") return;
  bool bf16 = true;
  for (const auto& dev : rank_devices(cfg.run.devices)) {
    if (!dev.is_cuda()) {
      bf16 = false;
      continue;
    }
#if defined(DD_HAVE_CUDA)
    if (at::cuda::getDeviceProperties(dev.index())->major < 8) bf16 = false;
#endif
  }
  cfg.train.precision = bf16 ? "bf16" : "fp32";
}

std::vector<c10::Device> rank_devices(const std::string& devices) {
  const int64_t gpus = gpu_count();
  std::vector<c10::Device> out;
  if (devices == "auto") {
    out.push_back(gpus > 0 ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU));
  } else if (devices == "cpu") {
    out.emplace_back(c10::kCPU);
  } else if (devices.rfind("cpu:", 0) == 0 && all_digits(devices.substr(4))) {
    out.assign(static_cast<size_t>(std::stoll(devices.substr(4))), c10::Device(c10::kCPU));
  } else if (devices == "all") {
    for (int64_t i = 0; i < gpus; ++i) out.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
  } else {
    for (int64_t i : gpu_indices(devices)) {
      if (i >= gpus) {
        out.clear();
        break;
      }
      out.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
    }
  }
  if (out.empty()) throw std::runtime_error("run.devices: \"" + devices + "\" names no device on this machine");
  return out;
}

void bind_thread(const c10::Device& device) {
#if defined(DD_HAVE_CUDA)
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

void preload_cuda_libraries(const c10::Device& device) {
  if (!device.is_cuda()) return;
  // LibTorch loads its CUDA linear-algebra library (cuSOLVER/cuBLAS triangular solves, which the
  // chunked gated delta rule uses) on first use through a lazy stub that is not thread-safe: two rank
  // threads reaching it together abort with "lazy wrapper should be called at most once".
  auto a = torch::eye(2, torch::TensorOptions().device(device));
  (void)torch::linalg_solve_triangular(a, a, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
}

std::string describe_device(const c10::Device& device) {
  if (!device.is_cuda()) return "cpu";
#if defined(DD_HAVE_CUDA)
  const auto* p = at::cuda::getDeviceProperties(device.index());
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s (%s, %.1f GiB, sm_%d%d)", device.str().c_str(), p->name,
                static_cast<double>(p->totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), p->major, p->minor);
  return buf;
#else
  return device.str();
#endif
}

double known_peak_tflops(const c10::Device& device, const std::string& precision) {
  if (!device.is_cuda()) return 0;
  const std::string name = gpu_name(device.index());
  struct Peak {
    const char* name_part;
    const char* not_part;  // the entry does not apply when the name contains this
    double bf16, fp8;      // dense TFLOP/s from the vendors' data sheets
  };
  static const Peak table[] = {
      {"H200", nullptr, 989.4, 1978.9},    {"H100 PCIe", nullptr, 756.0, 1513.0},
      {"H100 NVL", nullptr, 835.0, 1671.0}, {"H100", nullptr, 989.4, 1978.9},
      {"H800", nullptr, 989.4, 1978.9},    {"GH200", nullptr, 989.4, 1978.9},
      {"B200", nullptr, 2250.0, 4500.0},   {"A100", nullptr, 312.0, 0.0},
      {"A800", nullptr, 312.0, 0.0},       {"L40S", nullptr, 362.0, 733.0},
      {"L4", "L40", 121.0, 242.0},         {"RTX 4090", nullptr, 165.2, 330.3},
  };
  for (const auto& e : table) {
    if (name.find(e.name_part) == std::string::npos) continue;
    if (e.not_part && name.find(e.not_part) != std::string::npos) continue;
    return precision == "fp8" ? e.fp8 : e.bf16;
  }
  return 0;
}

DeviceMemory device_memory(const c10::Device& device, bool reset_peak) {
  DeviceMemory m;
#if defined(DD_HAVE_CUDA)
  if (!device.is_cuda()) return m;
  using c10::cuda::CUDACachingAllocator::getDeviceStats;
  const auto stats = getDeviceStats(device.index());
  constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  m.allocated_gib = static_cast<double>(stats.allocated_bytes[kAll].current) / kGiB;
  m.reserved_gib = static_cast<double>(stats.reserved_bytes[kAll].current) / kGiB;
  m.peak_gib = static_cast<double>(stats.allocated_bytes[kAll].peak) / kGiB;
  if (reset_peak) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#else
  (void)device;
  (void)reset_peak;
#endif
  return m;
}

at::Tensor device_rng_state(const c10::Device& device) {
#if defined(DD_HAVE_CUDA)
  if (device.is_cuda()) {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  }
#endif
  (void)device;
  return at::Tensor();
}

void set_device_rng_state(const c10::Device& device, const at::Tensor& state) {
#if defined(DD_HAVE_CUDA)
  if (device.is_cuda()) {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
    return;
  }
#endif
  (void)device;
  (void)state;
}

}  // namespace trainer
