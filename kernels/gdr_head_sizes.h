// Whether the delta rule's kernels on the 16-bit path run their instances compiled for the model's
// head sizes where the sizes are those (on by default): the front, the solve's backward and the
// tail at (dk, dv) = (96, 192), (128, 128), (128, 256) (kernels/gdr_chunk_stage.cuh,
// with_head_sizes); the state products at dv 128, 192, 256 (any dk they take); both bf16 scans at
// C = 64 and dk 96 or 128 (any dv). Off, every launch takes the instance that reads the sizes as
// arguments. The results are the same bits either way (the tail at dk = 96 groups its tiles into
// one pass instead of three, each tile's sums in the same order), so tests compare the two.
#pragma once

#include <cstdint>

namespace kernels {

void gdr_fixed_head_sizes(bool on);
bool gdr_fixed_head_sizes();

// The kernels that have such instances, for the launch counters below.
enum class GdrSizedKernel : int { kFront, kStateGrads, kSolveBackward, kTail, kScanForward, kScanReverse, kCount };
// How many launches of that kernel's fixed-size instances this process has made (tests check each
// was taken), and the launches' count.
int64_t gdr_fixed_head_size_launches(GdrSizedKernel kernel);
void gdr_count_fixed_head_size_launch(GdrSizedKernel kernel);

// Whether the front's fixed-size instances take q, k and v by 16-byte cp.async where those rows are
// aligned for it (on by default): q and k in flight while the block works out the gates, V's second
// panel while the first one's product runs, instead of through registers (docs/perf.md, issue 7,
// stop 84; the tail's q and k the same way were not faster). The same bits either way. The count
// is of the front's launches that took the copies.
void gdr_chunk_copies16(bool on);
bool gdr_chunk_copies16();
int64_t gdr_chunk_copies16_launches();
void gdr_count_chunk_copies16_launch();

// Whether the fixed-size instances of the front and the tail (16-bit q and k) work out the masks'
// decays e^(γ_i − γ_j) by ex2.approx (on by default) or by expf (kernels/gdr_chunk_stage.cuh,
// decay_between): the instances that read the sizes as arguments take ex2.approx on the 16-bit
// path always. For comparing the two (`bench train --chunk-decay fast|exact`); the count is of the
// front's and the tail's launches that took expf.
void gdr_chunk_fast_decay(bool on);
bool gdr_chunk_fast_decay();
int64_t gdr_chunk_exact_decay_launches();
void gdr_count_chunk_exact_decay_launch();

}  // namespace kernels
