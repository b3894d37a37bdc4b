// Only the handful of NVML entry points we read, declared here with NVML's documented C signatures
// (nvml.h is not needed at build time). Every call returns 0 (NVML_SUCCESS) on success.
#include "trainer/telemetry.h"

#include <dlfcn.h>

namespace trainer {

namespace {

using nvmlDevice_t = void*;
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
constexpr int kNvmlTemperatureGpu = 0;
constexpr int kNvmlClockSm = 1;

template <typename F>
F symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

struct Telemetry::Api {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned int*) = nullptr;
  int (*handle)(unsigned int, nvmlDevice_t*) = nullptr;
  int (*utilization)(nvmlDevice_t, NvmlUtilization*) = nullptr;
  int (*memory)(nvmlDevice_t, NvmlMemory*) = nullptr;
  int (*power)(nvmlDevice_t, unsigned int*) = nullptr;
  int (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  int (*clock)(nvmlDevice_t, int, unsigned int*) = nullptr;
  std::vector<nvmlDevice_t> devices;
};

std::unique_ptr<Telemetry> Telemetry::open() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return nullptr;
  auto api = std::make_unique<Api>();
  api->lib = lib;
  api->init = symbol<int (*)()>(lib, "nvmlInit_v2");
  api->shutdown = symbol<int (*)()>(lib, "nvmlShutdown");
  api->count = symbol<int (*)(unsigned int*)>(lib, "nvmlDeviceGetCount_v2");
  api->handle = symbol<int (*)(unsigned int, nvmlDevice_t*)>(lib, "nvmlDeviceGetHandleByIndex_v2");
  api->utilization = symbol<int (*)(nvmlDevice_t, NvmlUtilization*)>(lib, "nvmlDeviceGetUtilizationRates");
  api->memory = symbol<int (*)(nvmlDevice_t, NvmlMemory*)>(lib, "nvmlDeviceGetMemoryInfo");
  api->power = symbol<int (*)(nvmlDevice_t, unsigned int*)>(lib, "nvmlDeviceGetPowerUsage");
  api->temperature = symbol<int (*)(nvmlDevice_t, int, unsigned int*)>(lib, "nvmlDeviceGetTemperature");
  api->clock = symbol<int (*)(nvmlDevice_t, int, unsigned int*)>(lib, "nvmlDeviceGetClockInfo");
  unsigned int n = 0;
  if (!api->init || !api->shutdown || !api->count || !api->handle || api->init() != 0) {
    dlclose(lib);
    return nullptr;
  }
  if (api->count(&n) != 0 || n == 0) {
    api->shutdown();
    dlclose(lib);
    return nullptr;
  }
  for (unsigned int i = 0; i < n; ++i) {
    nvmlDevice_t d = nullptr;
    if (api->handle(i, &d) == 0) api->devices.push_back(d);
  }
  return std::unique_ptr<Telemetry>(new Telemetry(std::move(api)));
}

Telemetry::Telemetry(std::unique_ptr<Api> api) : api_(std::move(api)) {}

Telemetry::~Telemetry() {
  api_->shutdown();
  dlclose(api_->lib);
}

int Telemetry::device_count() const { return static_cast<int>(api_->devices.size()); }

std::vector<GpuSample> Telemetry::sample() {
  std::vector<GpuSample> out;
  for (size_t i = 0; i < api_->devices.size(); ++i) {
    nvmlDevice_t d = api_->devices[i];
    GpuSample s;
    s.index = static_cast<int>(i);
    NvmlUtilization u{};
    if (api_->utilization && api_->utilization(d, &u) == 0) s.utilization = u.gpu;
    NvmlMemory m{};
    if (api_->memory && api_->memory(d, &m) == 0)
      s.memory_used_gib = static_cast<double>(m.used) / (1024.0 * 1024.0 * 1024.0);
    unsigned int v = 0;
    if (api_->power && api_->power(d, &v) == 0) s.power_w = v / 1000.0;
    if (api_->temperature && api_->temperature(d, kNvmlTemperatureGpu, &v) == 0) s.temperature_c = v;
    if (api_->clock && api_->clock(d, kNvmlClockSm, &v) == 0) s.sm_clock_mhz = v;
    out.push_back(s);
  }
  return out;
}

std::vector<std::pair<std::string, double>> Telemetry::as_metrics(const std::vector<GpuSample>& samples) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& s : samples) {
    const std::string p = "gpu" + std::to_string(s.index) + ".";
    out.emplace_back(p + "util", s.utilization);
    out.emplace_back(p + "mem_used_gib", s.memory_used_gib);
    out.emplace_back(p + "power_w", s.power_w);
    out.emplace_back(p + "temp_c", s.temperature_c);
    out.emplace_back(p + "sm_clock_mhz", s.sm_clock_mhz);
  }
  return out;
}

}  // namespace trainer
