// Whether the delta rule's chunk kernels run their instances compiled for the model's head sizes
// (kernels/gdr_chunk_stage.cuh, with_head_sizes; and the state products' kernel) where the sizes
// are those: on by default. Off, every launch takes the instance that reads dk and dv as
// arguments, the same arithmetic in the same order, so tests can compare the two to the bit.
#pragma once

#include <cstdint>

namespace kernels {

void gdr_fixed_head_sizes(bool on);
bool gdr_fixed_head_sizes();
// How many launches this process has made of those instances (tests check they were taken).
int64_t gdr_fixed_head_size_launches();
void gdr_count_fixed_head_size_launch();

}  // namespace kernels
