// One block per (chunk, head), kThreads threads striding over the chunk's [C, d] or [C, C] tile;
// the per-row gate values (γ, β, e^γ, κ) are staged in shared memory once. Per-row sums (the
// gradients of β and γ) are warp-reduced when a warp's 32 consecutive elements share a row (row
// length a multiple of 32, as at the model's sizes), else added element by element; column sums
// are conflict-free shared atomics. The reverse cumsum and the γ cumsum run one thread per row,
// each summing in the same order as the ATen reference's sequential scan.
#include <cuda_runtime.h>

#include "kernels/elem.cuh"
#include "kernels/gdr_chunk.h"
#include "kernels/gdr_chunk_io.cuh"

namespace kernels {

namespace {

using namespace gdr_chunk_io;

constexpr int kThreads = 256;
constexpr int kMaxC = 64;

// Adds x to s[i]. With warp_rows, the whole warp shares row i (and takes this call together).
__device__ __forceinline__ void add_row(float* s, int i, float x, bool warp_rows) {
  if (warp_rows) {
    x = warp_sum(x);
    if ((threadIdx.x & 31) == 0) atomicAdd(s + i, x);
  } else {
    atomicAdd(s + i, x);
  }
}

// The per-row gate values of one chunk in shared memory: γ = cumsum(g), β, e^γ, κ = e^{γ_last − γ}.
struct Gates {
  float gam[kMaxC], b[kMaxC], e[kMaxC], kap[kMaxC];
};

// Stages the gates of chunk-row r from prep's γ and β (rows past a chunk's length hold zeros).
__device__ void load_gates(Gates& s, const float* gam, const float* b, int64_t r, int C) {
  const int i = threadIdx.x;
  if (i < C) {
    s.gam[i] = gam[r * C + i];
    s.b[i] = b[r * C + i];
  }
  __syncthreads();
  if (i < C) {
    s.e[i] = expf(s.gam[i]);
    s.kap[i] = expf(s.gam[C - 1] - s.gam[i]);
  }
  __syncthreads();
}

template <typename T, typename TV, int VW>
__global__ void __launch_bounds__(kThreads) gdr_chunk_prep_kernel(GdrChunkList l, GdrChunkPrepArgs a) {
  __shared__ float g_s[kMaxC];
  __shared__ Gates s;
  const int64_t r = blockIdx.x, n = r / l.H, h = r % l.H;
  const int C = static_cast<int>(l.C), dk = static_cast<int>(l.dk), dv = static_cast<int>(l.dv);
  const int64_t start = l.chunk_start[n];
  const int len = l.chunk_len[n];
  const int t = threadIdx.x;
  if (t < C) {
    const bool valid = t < len;
    g_s[t] = valid ? a.g[(start + t) * l.H + h] : 0.f;
    s.b[t] = valid ? a.beta[(start + t) * l.H + h] : 0.f;
  }
  __syncthreads();
  if (t < C) {
    float acc = 0.f;
    for (int j = 0; j <= t; ++j) acc += g_s[j];
    s.gam[t] = acc;
  }
  __syncthreads();
  if (t < C) {
    s.e[t] = expf(s.gam[t]);
    s.kap[t] = expf(s.gam[C - 1] - s.gam[t]);
    a.gam[r * C + t] = s.gam[t];
    a.b[r * C + t] = s.b[t];
    if (t == 0) a.decay[r] = expf(s.gam[C - 1]);
  }
  __syncthreads();
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const TV* v = static_cast<const TV*>(a.v);
  const int64_t v_stride = a.v_token_stride != 0 ? a.v_token_stride : l.H * dv;
  const int dk_n = dk / VW, dv_n = dv / VW;
  for (int el = t; el < C * dk_n; el += kThreads) {
    const int i = el / dk_n, d = (el % dk_n) * VW;
    const bool valid = i < len;
    const int64_t src = ((start + i) * l.H + h) * dk + d;
    float qv[VW], kv[VW], rw[VW], kd[VW], qg[VW];
    load_n<VW>(qv, q + src, valid);
    load_n<VW>(kv, k + src, valid);
#pragma unroll
    for (int j = 0; j < VW; ++j) {
      rw[j] = (s.b[i] * s.e[i]) * kv[j];
      kd[j] = s.kap[i] * kv[j];
      qg[j] = s.e[i] * qv[j];
    }
    const int64_t row = (r * C + i) * dk + d;
    store_n<VW>(a.X + (r * 2 * C + i) * dk + d, qv);
    store_n<VW>(a.X + (r * 2 * C + C + i) * dk + d, kv);
    store_n<VW>(a.Rw + row, rw);
    store_n<VW>(a.Kd + row, kd);
    store_n<VW>(a.Qg + row, qg);
  }
  for (int el = t; el < C * dv_n; el += kThreads) {
    const int i = el / dv_n, d = (el % dv_n) * VW;
    float vv[VW];
    load_n<VW>(vv, v + (start + i) * v_stride + h * dv + d, i < len);
#pragma unroll
    for (int j = 0; j < VW; ++j) vv[j] *= s.b[i];
    store_n<VW>(a.Ru + (r * C + i) * dv + d, vv);
  }
}

__global__ void __launch_bounds__(kThreads) gdr_chunk_masks_kernel(GdrChunkList l, GdrChunkMasksArgs a) {
  __shared__ Gates s;
  const int64_t r = blockIdx.x;
  const int C = static_cast<int>(l.C);
  load_gates(s, a.gam, a.b, r, C);
  const float* Gq = a.G + r * 2 * C * C;  // Q Kᵀ
  const float* Gk = Gq + C * C;           // K Kᵀ
  for (int el = threadIdx.x; el < C * C; el += kThreads) {
    const int i = el / C, j = el % C;
    const float D = i >= j ? expf(s.gam[i] - s.gam[j]) : 0.f;
    a.P[r * C * C + el] = Gq[el] * D;
    a.A[r * C * C + el] = i > j ? s.b[i] * Gk[el] * D : 0.f;
  }
}

__global__ void __launch_bounds__(kThreads) gdr_chunk_masks_backward_kernel(GdrChunkList l,
                                                                             GdrChunkMasksBackwardArgs a) {
  __shared__ Gates s;
  __shared__ float dS_s[kMaxC * kMaxC];
  __shared__ float row_z[kMaxC], row_db[kMaxC], col_z[kMaxC];
  const int64_t r = blockIdx.x;
  const int C = static_cast<int>(l.C), t = threadIdx.x;
  if (t < C) row_z[t] = row_db[t] = col_z[t] = 0.f;
  load_gates(s, a.gam, a.b, r, C);
  const bool warp_rows = C % 32 == 0;
  const int64_t base = r * C * C;
  const float* Gq = a.G + r * 2 * C * C;
  const float* Gk = Gq + C * C;
  for (int el = t; el < C * C; el += kThreads) {
    const int i = el / C, j = el % C;
    const float D = i >= j ? expf(s.gam[i] - s.gam[j]) : 0.f;
    const float dA = i > j ? -a.dA_raw[base + el] : 0.f;
    const float S = Gk[el];
    dS_s[i * C + j] = dA * s.b[i] * D;
    const float dPm = (a.dP_raw != nullptr && i >= j) ? a.scale * a.dP_raw[base + el] * D : 0.f;
    a.dPm[base + el] = dPm;
    const float z = dA * s.b[i] * S * D + dPm * Gq[el];
    add_row(row_z, i, z, warp_rows);
    add_row(row_db, i, dA * S * D, warp_rows);
    atomicAdd(col_z + j, z);
  }
  __syncthreads();
  for (int el = t; el < C * C; el += kThreads) {
    const int i = el / C, j = el % C;
    a.dS_sym[base + el] = dS_s[i * C + j] + dS_s[j * C + i];
  }
  if (t < C) {
    a.db_A[r * C + t] = row_db[t];
    a.dgam[r * C + t] = row_z[t] - col_z[t];
  }
}

template <typename T, typename TV, int VW>
__global__ void __launch_bounds__(kThreads) gdr_chunk_input_grads_kernel(GdrChunkList l, GdrChunkInputGradsArgs a) {
  __shared__ Gates s;
  __shared__ float rw_k[kMaxC], ru_v[kMaxC], qg_q[kMaxC], kd_k[kMaxC], dgam_s[kMaxC];
  const int64_t r = blockIdx.x, n = r / l.H, h = r % l.H;
  const int C = static_cast<int>(l.C), dk = static_cast<int>(l.dk), dv = static_cast<int>(l.dv);
  const int64_t start = l.chunk_start[n];
  const int len = l.chunk_len[n];
  const int t = threadIdx.x;
  if (t < C) rw_k[t] = ru_v[t] = qg_q[t] = kd_k[t] = 0.f;
  load_gates(s, a.gam, a.b, r, C);
  const float* Q = a.X + r * 2 * C * dk;
  const float* K = Q + C * dk;
  T* dq = static_cast<T*>(a.dq);
  T* dkk = static_cast<T*>(a.dk);
  // Rows of dk / VW (dv / VW) vectors: a warp shares one row when that is a multiple of 32.
  const int dk_n = dk / VW, dv_n = dv / VW;
  const bool warp_rows_k = dk_n % 32 == 0, warp_rows_v = dv_n % 32 == 0;
  for (int el = t; el < C * dk_n; el += kThreads) {
    const int i = el / dk_n, d = (el % dk_n) * VW;
    const int64_t row = (r * C + i) * dk + d;
    float dqg[VW], drw[VW], dkd[VW], kv[VW], qv[VW], dqm[VW], dkm[VW];
    load_n<VW>(dqg, a.dQg != nullptr ? a.dQg + row : nullptr, a.dQg != nullptr);
    load_n<VW>(drw, a.dRw + row, true);
    load_n<VW>(dkd, a.dKd + row, true);
    load_n<VW>(kv, K + i * dk + d, true);
    load_n<VW>(qv, Q + i * dk + d, true);
    float s_rw = 0.f, s_qg = 0.f, s_kd = 0.f;
#pragma unroll
    for (int j = 0; j < VW; ++j) {
      s_rw += drw[j] * kv[j];
      s_qg += dqg[j] * qv[j];
      s_kd += dkd[j] * kv[j];
    }
    if (i < len) {
      load_n<VW>(dqm, a.dQ_mm + row, true);
      load_n<VW>(dkm, a.dK_mm + row, true);
#pragma unroll
      for (int j = 0; j < VW; ++j) {
        dqm[j] += s.e[i] * dqg[j];
        dkm[j] += (s.b[i] * s.e[i]) * drw[j] + s.kap[i] * dkd[j];
      }
      const int64_t dst = ((start + i) * l.H + h) * dk + d;
      store_n<VW>(dq + dst, dqm);
      store_n<VW>(dkk + dst, dkm);
    }
    add_row(rw_k, i, s_rw, warp_rows_k);
    add_row(qg_q, i, s_qg, warp_rows_k);
    add_row(kd_k, i, s_kd, warp_rows_k);
  }
  const TV* v = static_cast<const TV*>(a.v);
  const int64_t v_stride = a.v_token_stride != 0 ? a.v_token_stride : l.H * dv;
  TV* dvv = static_cast<TV*>(a.dv);
  for (int el = t; el < C * dv_n; el += kThreads) {
    const int i = el / dv_n, d = (el % dv_n) * VW;
    float dru[VW], vv[VW];
    load_n<VW>(dru, a.dRu + (r * C + i) * dv + d, true);
    const int64_t tok = ((start + i) * l.H + h) * dv + d;
    load_n<VW>(vv, v + (start + i) * v_stride + h * dv + d, i < len);
    float s_ru = 0.f;
#pragma unroll
    for (int j = 0; j < VW; ++j) {
      s_ru += dru[j] * vv[j];
      dru[j] *= s.b[i];
    }
    if (i < len) store_n<VW>(dvv + tok, dru);
    add_row(ru_v, i, s_ru, warp_rows_v);
  }
  __syncthreads();
  float db = 0.f;
  if (t < C) {
    const float e = s.e[t];
    db = a.db_A[r * C + t] + e * rw_k[t] + ru_v[t];
    dgam_s[t] = a.dgam[r * C + t] + s.b[t] * e * rw_k[t] + e * qg_q[t] - s.kap[t] * kd_k[t];
  }
  __syncthreads();
  if (t == 0) {
    float last = 0.f;
    for (int i = 0; i < C; ++i) last += s.kap[i] * kd_k[i];
    dgam_s[C - 1] += last + a.ddecay[r] * a.decay[r];
  }
  __syncthreads();
  if (t < len) {
    float acc = 0.f;
    for (int j = C - 1; j >= t; --j) acc += dgam_s[j];
    const int64_t tok = (start + t) * l.H + h;
    a.dg[tok] = acc;
    a.dbeta[tok] = db;
  }
}

bool takes(const GdrChunkList& l) {
  return gdr_chunk_supports(l.C) && l.N * l.H >= 1 && l.N * l.H <= 2147483647LL && l.dk >= 1 && l.dv >= 1;
}

}  // namespace

int gdr_chunk_prep_forward(const GdrChunkList& l, const GdrChunkPrepArgs& a, void* stream) {
  if (!takes(l)) return static_cast<int>(cudaErrorInvalidValue);
  const unsigned grid = static_cast<unsigned>(l.N * l.H);
  const bool vec = vectorizable(l, a.in_qk, a.in_v, {a.X, a.Rw, a.Ru, a.Kd, a.Qg}, {a.q, a.k}, {a.v},
                                a.v_token_stride);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_two_dtypes(a.in_qk, a.in_v, vec, [&](auto qk_tag, auto v_tag, auto width) {
    gdr_chunk_prep_kernel<decltype(qk_tag), decltype(v_tag), decltype(width)::value><<<grid, kThreads, 0, st>>>(l, a);
  });
  return static_cast<int>(cudaGetLastError());
}

int gdr_chunk_masks_forward(const GdrChunkList& l, const GdrChunkMasksArgs& a, void* stream) {
  if (!takes(l)) return static_cast<int>(cudaErrorInvalidValue);
  gdr_chunk_masks_kernel<<<static_cast<unsigned>(l.N * l.H), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(l, a);
  return static_cast<int>(cudaGetLastError());
}

int gdr_chunk_masks_backward(const GdrChunkList& l, const GdrChunkMasksBackwardArgs& a, void* stream) {
  if (!takes(l)) return static_cast<int>(cudaErrorInvalidValue);
  gdr_chunk_masks_backward_kernel<<<static_cast<unsigned>(l.N * l.H), kThreads, 0,
                                    static_cast<cudaStream_t>(stream)>>>(l, a);
  return static_cast<int>(cudaGetLastError());
}

int gdr_chunk_input_grads(const GdrChunkList& l, const GdrChunkInputGradsArgs& a, void* stream) {
  if (!takes(l)) return static_cast<int>(cudaErrorInvalidValue);
  const unsigned grid = static_cast<unsigned>(l.N * l.H);
  const bool vec = vectorizable(l, a.in_qk, a.in_v, {a.dQ_mm, a.dK_mm, a.dQg, a.dRw, a.dRu, a.dKd, a.X},
                                {a.dq, a.dk}, {a.v, a.dv}, a.v_token_stride);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_two_dtypes(a.in_qk, a.in_v, vec, [&](auto qk_tag, auto v_tag, auto width) {
    gdr_chunk_input_grads_kernel<decltype(qk_tag), decltype(v_tag), decltype(width)::value>
        <<<grid, kThreads, 0, st>>>(l, a);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels
