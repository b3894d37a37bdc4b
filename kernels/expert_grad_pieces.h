// The MoE experts' weight-gradient product dW_e = dy_eᵀ · x_e sums over expert e's rows, so the
// grouped GEMM gives each expert a fixed set of output tiles whose length is that expert's row
// count. With uneven routing (at moe-1b's start a few experts draw several times the mean) the
// largest expert's tiles run long after the others are done: moe-1b's two weight-gradient products
// took 10.5 ms a step against 5.4 ms at even counts. Here each expert's rows are cut into pieces of
// at most `piece_rows`, every piece is a group of the GEMM (its partial dW), and the pieces of one
// expert are summed in fp32 as the partials go into .grad (kernels/block_grads.h).
// Raw pointers, no torch; the reference is the unsplit product (model/expert_product.cpp).
#pragma once

#include <cstdint>

namespace kernels {

// Experts the split takes (one thread an expert, one block).
constexpr int64_t kExpertPiecesMaxExperts = 1024;

// Groups the split may produce for `rows` rows over E experts: Σ_e ceil(n_e / piece_rows) is below
// E + ceil(rows / piece_rows). The GEMM is given this many groups; those past the real pieces are
// empty (they end where the last piece ends).
inline int64_t expert_pieces_bound(int64_t E, int64_t rows, int64_t piece_rows) {
  return E + (rows + piece_rows - 1) / piece_rows;
}

#ifdef DD_HAVE_CUDA
// ends [E] int32: each expert's end row (nondecreasing, the first expert starting at 0). Writes
// piece_ends [G] int32 (G = expert_pieces_bound(E, rows, piece_rows); each piece's end row, expert by
// expert, then ends[E − 1] for the empty rest), first [E] and count [E] int32 (expert e's pieces are
// first[e] .. first[e] + count[e] − 1; an expert without rows has none). One block. Returns the
// cudaError_t of the launch (cudaErrorInvalidValue for E outside 1..kExpertPiecesMaxExperts or
// piece_rows < 1).
int expert_grad_pieces(const int32_t* ends, int64_t E, int64_t piece_rows, int64_t G, int32_t* piece_ends,
                       int32_t* first, int32_t* count, void* stream);
#endif

}  // namespace kernels
