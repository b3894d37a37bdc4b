// The dry run's LibTorch parts, kept in one translation unit so the report itself compiles fast.
#include <torch/torch.h>

#include "app/dry_run.h"
#include "model/decoder_lm.h"
#include "model/model_config.h"
#include "trainer/device.h"

namespace app {

DryRunDevices probe_devices(const trainer::RunConfig& cfg) {
  DryRunDevices out;
  const std::vector<c10::Device> devices = trainer::rank_devices(cfg.run.devices);
  for (const auto& d : devices) out.names.push_back(trainer::describe_device(d));
  out.peak_tflops = cfg.run.peak_tflops > 0 ? cfg.run.peak_tflops
                    : devices.empty()      ? 0
                                           : trainer::known_peak_tflops(devices[0], cfg.train.precision);
  return out;
}

int64_t built_param_count(const trainer::RunConfig& cfg, int64_t max_bytes) {
  if (model::count_params(cfg.model) * 4 > max_bytes) return -1;
  torch::NoGradGuard no_grad;
  model::DecoderLM m(cfg.model);
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  return n;
}

}  // namespace app
