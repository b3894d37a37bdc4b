// `deltadeck bench model`: forward+backward time of one Gated DeltaNet layer, chunked
// (WY/UT, the training path) vs the step-by-step recurrent reference, on the CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace app {

struct BenchModelArgs {
  std::string preset = "tiny";                   // the G layer's sizes come from this hybrid preset
  std::vector<int64_t> lengths{256, 1024, 4096};  // T values
  int repeats = 3;                               // timed runs per point (the best is reported)
  int threads = 0;                               // ATen threads; 0 keeps the default
};

// Prints one line per T; returns the exit code (2 for bad arguments). Main thread.
int bench_model(const BenchModelArgs& args);

}  // namespace app
