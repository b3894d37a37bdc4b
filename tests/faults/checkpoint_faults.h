// Test doubles for checkpoint I/O (storage::FileIo) and small checkpoints to save through them.
//   RecordingIo  records every operation in order; can fail the first allocating operation that
//                crosses a byte offset with ENOSPC (a disk filling mid-write), and can "crash" after
//                the k-th operation: every later operation throws SimulatedCrash before touching the
//                disk, so the files are left exactly as a SIGKILL after operation k leaves them
//                (cleanup code of the dying save runs, but can change nothing).
#pragma once

#include <torch/torch.h>

#include <cerrno>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "storage/file_io.h"
#include "trainer/checkpoint.h"

namespace faults {

struct SimulatedCrash : std::runtime_error {
  SimulatedCrash() : std::runtime_error("simulated crash: the process is gone") {}
};

struct IoRecord {
  storage::IoOp op;
  std::string path;
};

class RecordingIo : public storage::FileIo {
 public:
  std::vector<IoRecord> ops;  // completed operations, in order
  int64_t crash_after = -1;   // >= 1: the process dies right after this many operations
  int64_t enospc_at_byte = -1;  // >= 0: the write crossing this byte (of all written) fails
  bool enospc_persists = false;  // and every allocating operation after it
  bool dead = false;
  bool enospc_fired = false;
  uint64_t written = 0;

 protected:
  Verdict before(storage::IoOp op, const std::string&, uint64_t, uint64_t bytes) override {
    if (dead) throw SimulatedCrash();
    Verdict v;
    const bool allocates = op == storage::IoOp::Write || op == storage::IoOp::Create || op == storage::IoOp::MakeDir;
    if (allocates && enospc_fired && enospc_persists) {
      v.error = ENOSPC;
      v.allow = 0;
    } else if (op == storage::IoOp::Write && enospc_at_byte >= 0 && !enospc_fired &&
               written + bytes > static_cast<uint64_t>(enospc_at_byte)) {
      enospc_fired = true;
      v.error = ENOSPC;
      v.allow = static_cast<uint64_t>(enospc_at_byte) - written;
    }
    if (op == storage::IoOp::Write) written += v.error ? std::min<uint64_t>(bytes, v.allow) : bytes;
    return v;
  }
  void after(storage::IoOp op, const std::string& path) override {
    ops.push_back({op, path});
    if (crash_after >= 1 && static_cast<int64_t>(ops.size()) == crash_after) dead = true;
  }
};

// A checkpoint of `step` whose tensors are drawn from (step, seed): sizes vary with the seed, so
// the sweeps cover saves of different lengths; equal inputs give bit-identical tensors.
inline trainer::CheckpointData sample_checkpoint(int64_t step, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(step));
  torch::manual_seed(static_cast<uint64_t>(step) * 7919u + seed);
  const int64_t rows = 1 + static_cast<int64_t>(rng() % 300);
  trainer::CheckpointData d;
  d.step = step;
  d.weights = {{"emb.weight", torch::randn({rows, 16})}, {"blocks.0.norm.weight", torch::randn({16})},
               {"head.bias", torch::randn({static_cast<int64_t>(1 + rng() % 7)})}};
  d.state = {{"exp_avg.emb.weight", torch::randn({rows, 16})},
             {"exp_avg_sq.emb.weight", torch::rand({rows, 16})},
             {"rng.cpu", torch::randint(0, 255, {64}, torch::kUInt8)}};
  d.meta = {{"tokens", std::to_string(step * 128)}, {"loader.state", "pos=" + std::to_string(step)}};
  d.compat = {{"model.d", "16"}, {"world_size", "1"}};
  return d;
}

inline bool same_tensors(const trainer::NamedTensors& a, const trainer::NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !torch::equal(a[i].second, b[i].second)) return false;
  return true;
}

inline std::string step_dir(const std::string& root, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/step_%08lld", static_cast<long long>(step));
  return root + buf;
}

}  // namespace faults
