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

struct BenchDataArgs {
  std::vector<std::string> sources;  // data.train specs
  std::string tokenizer = "byte";
  int64_t vocab_size = 0;            // 0: the tokenizer's (token sources: 65536)
  int64_t threads = 2;               // producer threads
  int64_t seq_len = 1024;
  int64_t batch_size = 16;
  double seconds = 5;
  std::vector<std::string> exclude;
  std::string separator = "";
  int64_t eot_token = 50256;
};

// Runs the training loader alone (index, read, tokenize, pack, pinned tensors) for `seconds` and
// prints tokens/s; returns the exit code (1 when the data cannot be read). Main thread.
int bench_data(const BenchDataArgs& args);

struct BenchGdrArgs {
  int64_t batch = 8, seq = 2048, heads = 16, head_dim = 128, chunk = 64;
  int64_t value_dim = 0;  // dv; 0: the same as head_dim
  std::string dtype = "bf16";  // bf16 | fp32 (the inputs; the core computes in fp32)
  int repeats = 20;
  bool profile = false;  // also print where the GPU time goes (kernel scan), per component and kernel
  bool default_only = false;  // only the first row (the kernels as training runs them)
  // fast | exact: the masks' decays in the front and the tail at fixed head sizes by ex2.approx or
  // by expf (kernels::gdr_chunk_fast_decay), to measure it.
  std::string chunk_decay = "fast";
};

// Times the chunked gated delta rule forward and forward+backward, scan kernel vs ATen loop, on
// the GPU when there is one. Returns the exit code (2 for bad arguments). Main thread.
int bench_gdr(const BenchGdrArgs& args);

}  // namespace app
