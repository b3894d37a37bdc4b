// The dry run's LibTorch parts, kept in one translation unit so the report itself compiles fast.
#include <torch/torch.h>

#include "app/dry_run.h"
#include "model/decoder_lm.h"
#include "model/model_config.h"
#include "trainer/data/loader.h"
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

DryRunSplit probe_split(const trainer::RunConfig& cfg) {
  DryRunSplit out;
  try {
    trainer::data::Loader loader(cfg, 0, 1, "");
    out.train_documents = loader.stats().train_documents;
    out.val_documents = loader.stats().val_documents;
    out.val_tokens = loader.stats().val_tokens;
    out.val_batches = static_cast<int64_t>(loader.validation().size());
  } catch (const std::exception& e) {
    out.error = e.what();
  }
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
