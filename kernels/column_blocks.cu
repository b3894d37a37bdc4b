// fill_column_blocks_16bit: the grid's y index is the block; x-threads stride over its N × pieces,
// a piece 8 elements (one 16-byte load and store) where the block's columns, both row strides and
// both pointers allow, else one element.
#include <cuda_runtime.h>

#include "kernels/column_blocks.h"

namespace kernels {

namespace {

constexpr int kThreads = 256;

struct Blocks {
  ColumnBlock b[kMaxColumnBlocks];
  bool vec[kMaxColumnBlocks];
};

__global__ void fill_column_blocks_kernel(uint16_t* dst, int64_t N, int64_t ld, Blocks blocks) {
  const ColumnBlock& b = blocks.b[blockIdx.y];
  const bool vec = blocks.vec[blockIdx.y];
  const int per = vec ? 8 : 1;
  const int64_t pieces = b.width / per, total = N * pieces;
  const auto* src = static_cast<const uint16_t*>(b.src);
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < total; i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i / pieces, c = (i % pieces) * per;
    uint16_t* d = dst + r * ld + b.col + c;
    if (vec) {
      *reinterpret_cast<uint4*>(d) =
          src != nullptr ? *reinterpret_cast<const uint4*>(src + r * b.src_ld + c) : make_uint4(0u, 0u, 0u, 0u);
    } else {
      *d = src != nullptr ? src[r * b.src_ld + c] : uint16_t{0};
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int fill_column_blocks_16bit(void* dst, int64_t N, int64_t ld, const ColumnBlock* blocks, int n_blocks, void* stream) {
  if (n_blocks > kMaxColumnBlocks || n_blocks < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (N == 0 || n_blocks == 0) return 0;
  Blocks arg{};
  int64_t most = 0;
  for (int i = 0; i < n_blocks; ++i) {
    const ColumnBlock& b = blocks[i];
    arg.b[i] = b;
    arg.vec[i] = b.width % 8 == 0 && b.col % 8 == 0 && ld % 8 == 0 && aligned16(dst) &&
                 (b.src == nullptr || (b.src_ld % 8 == 0 && aligned16(b.src)));
    most = b.width > most ? b.width : most;
  }
  // Enough x-blocks for the widest block's elements a thread (16-bit pieces: 8 a thread at most).
  const int64_t want = (N * most + kThreads - 1) / kThreads;
  const unsigned x = static_cast<unsigned>(want < 132 * 8 ? (want > 0 ? want : 1) : 132 * 8);
  fill_column_blocks_kernel<<<dim3(x, static_cast<unsigned>(n_blocks)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint16_t*>(dst), N, ld, arg);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels
