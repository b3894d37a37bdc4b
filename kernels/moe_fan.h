// The MoE layer's input fanned out to its three readers and their gradients fanned back in
// (model/moe_dispatch.h, moe_inputs): the router reads the fp32 input, the shared expert its
// 16-bit cast, and the routed experts k 16-bit copies of each token's row in expert order. As
// separate ops that was a cast, a gather that reads each token's row k times in expert order
// (from L2 at best, since consecutive expert-order rows belong to scattered tokens), and in the
// backward a gather-sum, a 16-bit add of the two experts' gradients and an fp32 add of the
// router's: at moe-1b's shape (N = 16k tokens of 1024, k = 6, 18 layers) 6.5 ms a step against
// these two kernels' 4.4 ms (docs/perf.md, stop 43). Both kernels walk tokens, one warp a token,
// so a row is read once and written k + 1 times (fan-out), or its k + 2 gradients are read once
// and summed in fp32 (fan-in). Raw pointers, no torch; the reference is the ATen composition in
// model/moe_dispatch.cpp.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

// Slots per token the kernels take (otherwise use the reference).
constexpr int64_t MOE_FAN_MAX_K = 16;
inline bool moe_fan_supports(int64_t k) { return k >= 1 && k <= MOE_FAN_MAX_K; }

#ifdef DD_HAVE_CUDA
// x [N, d] (xdt) -> rows [N·k, d] (rdt) with rows[inverse[t·k + j]] = x[t] for every slot j, and,
// when cast is not null, cast [N, d] (rdt) = x. inverse [N·k] int64 holds positions in [0, N·k).
// Rounds once, as a cast does. Returns the cudaError_t of the launch (0 = success).
int moe_fan_out(void* rows, void* cast, const void* x, const int64_t* inverse, int64_t N, int64_t k, int64_t d,
                DType xdt, DType rdt, void* stream);

// dx [N, d] (xdt) = a[t] + b[t] + Σ_j rows[inverse[t·k + j]], with a [N, d] of xdt (null: none),
// b [N, d] and rows [N·k, d] of rdt (b null: none). Sums in fp32 and rounds once.
int moe_fan_in(void* dx, const void* a, const void* b, const void* rows, const int64_t* inverse, int64_t N,
               int64_t k, int64_t d, DType xdt, DType rdt, void* stream);
#endif

}  // namespace kernels
