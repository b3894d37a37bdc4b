// Hopper's warpgroup matrix products (wgmma.mma_async, sm_90a only: build the file that includes
// this for CUDA architecture "90a") with A from registers and B from shared memory, and the
// shared-memory layout they read B in. A warpgroup is four consecutive warps starting at a warp
// index that is a multiple of 4; all 128 threads issue each instruction.
//
// D [64, N] (+)= A [64, 16] · B [16, N], bf16 operands, fp32 sums. Warp w of the group holds rows
// 16w .. 16w + 15 of A and D in mma.sync's m16n8k16 fragments: A as Frag16A (a[0] (g, 2t..),
// a[1] (g + 8, 2t..), a[2] (g, 2t + 8..), a[3] (g + 8, 2t + 8..)), D as N / 8 accumulator tiles
// d[nt][e] at (row g + 8 (e / 2), column 8 nt + 2t + e % 2). So accumulators of one product,
// rounded to bf16 pairs, are the A fragments of the next (kernels/gdr_scan_warps.cuh's pack_a).
//
// B is read through a descriptor of "interleaved" (unswizzled) core matrices: 8 rows of 16 bytes,
// 128 contiguous bytes each. Two orders (wgmma's imm-trans-b):
//   K-major (trans 0): B stored as [N][K] rows (B's transpose row-major, K contiguous); a core
//     matrix is 8 N-rows × 8 K-values;
//   N-major (trans 1): B stored as [K][N] rows (N contiguous); a core matrix is 8 K-rows × 8
//     N-values.
// The descriptor's leading byte offset steps between core matrices along K, its stride byte offset
// between core matrices along N. The tiles here put the K-adjacent core matrices next to each
// other (128 bytes apart) and the N-adjacent ones K / 8 core matrices apart, so one k-step of 16
// starts 256 bytes after the one before.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kernels::wgmma {

// The element offset (16-bit elements) of the 16-byte piece (row, piece) of a tile staged in the
// interleaved layout above, where the tile's source is row-major with `pieces` 16-byte pieces a
// row: K-major: source rows are N-rows, pieces run along K; N-major: source rows are K-rows
// (`rows` of them), pieces run along N.
__host__ __device__ constexpr int k_major_offset(int row, int piece, int pieces) {
  return ((row / 8) * pieces + piece) * 64 + (row % 8) * 8;
}
__host__ __device__ constexpr int n_major_offset(int row, int piece, int rows) {
  return (piece * (rows / 8) + row / 8) * 64 + (row % 8) * 8;
}

// The descriptor of a tile at `tile` (shared memory, 16-byte aligned) whose core matrices lie
// `k_step_bytes` apart along K and `n_step_bytes` apart along N; no swizzle, base offset 0.
__device__ __forceinline__ uint64_t descriptor(const void* tile, uint32_t k_step_bytes, uint32_t n_step_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>((k_step_bytes >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((n_step_bytes >> 4) & 0x3FFF) << 32;
}
// k-step ks (K from 16 ks) of a tile with K-adjacent core matrices 128 bytes apart.
__device__ __forceinline__ uint64_t at_k_step(uint64_t desc, int ks) { return desc + static_cast<uint64_t>(16 * ks); }

// Orders this thread's register writes before the products that read them (accumulators or A
// fragments), as wgmma requires.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Returns once at most N of this warpgroup's committed groups are still running.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Copies into shared memory by the generic proxy (cp.async, plain stores) made visible to the
// products' reads (the async proxy): each writing thread, after its writes and before the barrier.
__device__ __forceinline__ void fence_shared_for_products() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The compiler does not know that a product runs on after its instruction: registers it writes
// must not be read, and registers it reads must not be reused, before the wait. Passing them
// through an empty asm after the wait ties them to it (their reads come after, their values live
// until then).
template <int kN>
__device__ __forceinline__ void hold(float (&x)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(x[i][e])::"memory");
  }
}
template <int kN>
__device__ __forceinline__ void hold(uint32_t (&x)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(x[i][e])::"memory");
  }
}

// D [64, N] = (accumulate ? D : 0) + kScaleA · A B for one k-step, N 64, 96 or 128.
template <int N>
struct WgmmaRS;

template <>
struct WgmmaRS<64> {
  template <int kTransB, int kScaleA>
  __device__ __forceinline__ static void run(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,"
        "%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35},"
        " %36, p, %38, 1, %39;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kScaleA), "n"(kTransB));
  }
};

template <>
struct WgmmaRS<96> {
  template <int kTransB, int kScaleA>
  __device__ __forceinline__ static void run(float (&d)[12][4], const uint32_t (&a)[4], uint64_t desc,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,"
        "%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,"
        "%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, {%48,%49,%50,%51}, %52, p, %54, 1, %55;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
          "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
          "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kScaleA), "n"(kTransB));
  }
};

template <>
struct WgmmaRS<128> {
  template <int kTransB, int kScaleA>
  __device__ __forceinline__ static void run(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,"
        "%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,"
        "%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,"
        "%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, %70, 1, %71;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
          "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
          "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
          "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kScaleA), "n"(kTransB));
  }
};

// The product with B's layout as a parameter: kNMajor (B stored [K][N]) or K-major.
template <int N, bool kNMajor, int kScaleA = 1>
__device__ __forceinline__ void product(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc, bool accumulate) {
  WgmmaRS<N>::template run<kNMajor ? 1 : 0, kScaleA>(d, a, desc, accumulate ? 1 : 0);
}

}  // namespace kernels::wgmma
