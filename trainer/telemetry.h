// GPU telemetry through NVML, loaded at run time with dlopen: no build dependency, and on a machine
// without an NVIDIA driver open() simply returns nothing. Torch-free.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace trainer {

struct GpuSample {
  int index = 0;               // NVML's index (all GPUs of the node, as nvidia-smi numbers them)
  double utilization = 0;      // % of time a kernel ran over the last sample period
  double memory_used_gib = 0;  // device memory in use by every process
  double power_w = 0;
  double temperature_c = 0;
  double sm_clock_mhz = 0;
};

class Telemetry {
 public:
  // NVML initialised, or nullptr when the library or a GPU is missing. Any thread.
  static std::unique_ptr<Telemetry> open();
  ~Telemetry();
  Telemetry(const Telemetry&) = delete;
  Telemetry& operator=(const Telemetry&) = delete;

  int device_count() const;
  // One reading of every GPU; a value NVML cannot give stays 0. One thread at a time.
  std::vector<GpuSample> sample();
  // The metric values of a sample: gpu<i>.util, gpu<i>.mem_used_gib, gpu<i>.power_w, gpu<i>.temp_c,
  // gpu<i>.sm_clock_mhz.
  static std::vector<std::pair<std::string, double>> as_metrics(const std::vector<GpuSample>& samples);

 private:
  struct Api;
  explicit Telemetry(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace trainer
