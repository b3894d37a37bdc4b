// FP8 delayed scaling's amax records in checkpoints. Each rank's scales come from the amaxes of its
// own data, so a multi-rank checkpoint carries every rank's records: rank 0's under
// "fp8_amax.<module>", rank r's (r ≥ 1) under "fp8_amax_rank<r>.<module>". A resumed rank takes its
// own, so every rank quantises its first step as the uninterrupted run would have.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "trainer/checkpoint.h"
#include "trainer/comm.h"

namespace trainer {

// Whether a checkpoint state entry is fp8 amax records (of any rank).
bool is_fp8_record_state(const std::string& name);

// The state entries for `records` ((module path, records) of every fp8 layer, the same layers in
// the same order on every rank) of every rank: on rank 0 all of them, elsewhere none. With several
// ranks a collective (an all-gather): every rank calls it at the same point.
NamedTensors fp8_record_state(const std::vector<std::pair<std::string, at::Tensor>>& records, Communicator& comm);

// One layer's records to resume from.
struct Fp8RecordEntry {
  std::string state_name;  // the entry it came from, for errors
  std::string module;      // the layer's module path
  at::Tensor records;
};

// The records `rank` resumes from in a checkpoint's `state`: its own where the state holds them,
// rank 0's otherwise. Throws std::runtime_error naming `file` and an entry that is not
// fp8_amax_rank<r>.<module>.
std::vector<Fp8RecordEntry> fp8_records_for_rank(const NamedTensors& state, int rank, const std::string& file);

}  // namespace trainer
