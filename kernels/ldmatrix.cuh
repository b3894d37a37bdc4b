// Fragments of 16-bit mma.sync operands (m16n8k16, kernels/gdr_chunk_mma.cuh's Frag16A/Frag16B)
// straight from shared memory by ldmatrix: four (or, with .x2, two) 8 × 8 matrices of 16-bit
// values per instruction, lane l giving the address of row l % 8 of matrix l / 8 (16 bytes,
// 16-byte aligned). Without .trans, lane 4g + t receives (row g, columns 2t, 2t + 1) of each
// matrix; with .trans, (rows 2t, 2t + 1, column g). Rows whose pitch is an odd number of 16-byte
// units put a matrix's eight rows in eight different bank groups: one wavefront per matrix.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kernels {

__device__ __forceinline__ void ldmatrix_x4_b16(uint32_t (&r)[4], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans_b16(uint32_t (&r)[4], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Two matrices, transposed: lanes 0 – 15 give the rows' addresses (the others' are not read).
__device__ __forceinline__ void ldmatrix_x2_trans_b16(uint32_t (&r)[2], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr)
               : "memory");
}

// The A fragment (16 × 16 from (m0, k0)) of a row-major [m][k] tile of 16-bit values.
template <typename T>
__device__ __forceinline__ void ldsm_a(uint32_t (&r)[4], const T* s, int pitch, int m0, int k0, int lane) {
  const int j = lane / 8;  // matrices: (m0, k0), (m0 + 8, k0), (m0, k0 + 8), (m0 + 8, k0 + 8)
  ldmatrix_x4_b16(r, s + (m0 + lane % 8 + 8 * (j % 2)) * pitch + k0 + 8 * (j / 2));
}

// The A fragment (16 × 16 from (m0, k0)) of A = Xᵀ, X a row-major [k][m] tile of 16-bit values.
template <typename T>
__device__ __forceinline__ void ldsm_a_of_transposed(uint32_t (&r)[4], const T* s, int pitch, int m0, int k0,
                                                     int lane) {
  const int j = lane / 8;  // X's matrices: (k0, m0), (k0, m0 + 8), (k0 + 8, m0), (k0 + 8, m0 + 8)
  ldmatrix_x4_trans_b16(r, s + (k0 + lane % 8 + 8 * (j / 2)) * pitch + m0 + 8 * (j % 2));
}

// The B fragments (k 16 from k0) of two 8-column tiles, n0 and n0 + 8, of a row-major [k][n] tile
// of 16-bit values: r[0], r[1] tile n0's, r[2], r[3] tile n0 + 8's.
template <typename T>
__device__ __forceinline__ void ldsm_b_pair(uint32_t (&r)[4], const T* s, int pitch, int k0, int n0, int lane) {
  const int j = lane / 8;  // matrices: (k0, n0), (k0 + 8, n0), (k0, n0 + 8), (k0 + 8, n0 + 8)
  ldmatrix_x4_trans_b16(r, s + (k0 + lane % 8 + 8 * (j % 2)) * pitch + n0 + 8 * (j / 2));
}

// The B fragments (k 16 from k0) of two 8-column tiles, n0 and n0 + 8, of B = Xᵀ, X a row-major
// [n][k] tile of 16-bit values: r[0], r[1] tile n0's, r[2], r[3] tile n0 + 8's.
template <typename T>
__device__ __forceinline__ void ldsm_b_pair_of_transposed(uint32_t (&r)[4], const T* s, int pitch, int k0, int n0,
                                                          int lane) {
  const int j = lane / 8;  // X's matrices: (n0, k0), (n0, k0 + 8), (n0 + 8, k0), (n0 + 8, k0 + 8)
  ldmatrix_x4_b16(r, s + (n0 + lane % 8 + 8 * (j / 2)) * pitch + k0 + 8 * (j % 2));
}

}  // namespace kernels
