// One block per (chunk, head), kThreads threads striding over the chunk's [C, d] or [C, C] tile;
// the per-row gate values (γ, β, e^γ, κ) are staged in shared memory once. Per-row sums (the
// gradients of β and γ) are warp-reduced when a warp's 32 consecutive elements share a row (row
// length a multiple of 32, as at the model's sizes), else added element by element; column sums
// are conflict-free shared atomics. The reverse cumsum and the γ cumsum run one thread per row,
// each summing in the same order as the ATen reference's sequential scan.
#include <cuda_runtime.h>

#include "kernels/elem.cuh"
#include "kernels/gdr_chunk.h"

namespace kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxC = 64;

__device__ __forceinline__ float warp_sum(float x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

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

template <typename T, typename TV>
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
  for (int el = t; el < C * dk; el += kThreads) {
    const int i = el / dk, d = el % dk;
    const bool valid = i < len;
    const int64_t src = ((start + i) * l.H + h) * dk + d;
    const float qv = valid ? to_f32(q[src]) : 0.f, kv = valid ? to_f32(k[src]) : 0.f;
    const int64_t row = (r * C + i) * dk + d;
    a.X[(r * 2 * C + i) * dk + d] = qv;
    a.X[(r * 2 * C + C + i) * dk + d] = kv;
    a.Rw[row] = (s.b[i] * s.e[i]) * kv;
    a.Kd[row] = s.kap[i] * kv;
    a.Qg[row] = s.e[i] * qv;
  }
  for (int el = t; el < C * dv; el += kThreads) {
    const int i = el / dv, d = el % dv;
    const float vv = i < len ? to_f32(v[((start + i) * l.H + h) * dv + d]) : 0.f;
    a.Ru[(r * C + i) * dv + d] = s.b[i] * vv;
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

template <typename T, typename TV>
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
  const bool warp_rows_k = dk % 32 == 0, warp_rows_v = dv % 32 == 0;
  for (int el = t; el < C * dk; el += kThreads) {
    const int i = el / dk, d = el % dk;
    const int64_t row = (r * C + i) * dk + d;
    const float dqg = a.dQg ? a.dQg[row] : 0.f, drw = a.dRw[row], dkd = a.dKd[row];
    const float kv = K[el], qv = Q[el];
    if (i < len) {
      const int64_t dst = ((start + i) * l.H + h) * dk + d;
      dq[dst] = from_f32<T>(a.dQ_mm[row] + s.e[i] * dqg);
      dkk[dst] = from_f32<T>(a.dK_mm[row] + (s.b[i] * s.e[i]) * drw + s.kap[i] * dkd);
    }
    add_row(rw_k, i, drw * kv, warp_rows_k);
    add_row(qg_q, i, dqg * qv, warp_rows_k);
    add_row(kd_k, i, dkd * kv, warp_rows_k);
  }
  const TV* v = static_cast<const TV*>(a.v);
  TV* dvv = static_cast<TV*>(a.dv);
  for (int el = t; el < C * dv; el += kThreads) {
    const int i = el / dv, d = el % dv;
    const float dru = a.dRu[(r * C + i) * dv + d];
    float vv = 0.f;
    if (i < len) {
      const int64_t tok = ((start + i) * l.H + h) * dv + d;
      vv = to_f32(v[tok]);
      dvv[tok] = from_f32<TV>(s.b[i] * dru);
    }
    add_row(ru_v, i, dru * vv, warp_rows_v);
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

// Runs CALL(T, TV) for the element types of q|k and of v (each fp32, bf16 or fp16).
#define DD_GDR_CHUNK_DISPATCH_V(T, DT_V, CALL)            \
  switch (DT_V) {                                          \
    case DType::F32: CALL(T, float); break;                \
    case DType::BF16: CALL(T, __nv_bfloat16); break;       \
    case DType::F16: CALL(T, __half); break;               \
  }
#define DD_GDR_CHUNK_DISPATCH(DT_QK, DT_V, CALL)                                   \
  switch (DT_QK) {                                                                  \
    case DType::F32: DD_GDR_CHUNK_DISPATCH_V(float, DT_V, CALL) break;              \
    case DType::BF16: DD_GDR_CHUNK_DISPATCH_V(__nv_bfloat16, DT_V, CALL) break;     \
    case DType::F16: DD_GDR_CHUNK_DISPATCH_V(__half, DT_V, CALL) break;             \
  }

bool takes(const GdrChunkList& l) {
  return gdr_chunk_supports(l.C) && l.N * l.H >= 1 && l.N * l.H <= 2147483647LL && l.dk >= 1 && l.dv >= 1;
}

}  // namespace

int gdr_chunk_prep_forward(const GdrChunkList& l, const GdrChunkPrepArgs& a, void* stream) {
  if (!takes(l)) return static_cast<int>(cudaErrorInvalidValue);
  const unsigned grid = static_cast<unsigned>(l.N * l.H);
#define DD_LAUNCH(T, TV) gdr_chunk_prep_kernel<T, TV><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(l, a)
  DD_GDR_CHUNK_DISPATCH(a.in_qk, a.in_v, DD_LAUNCH);
#undef DD_LAUNCH
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
#define DD_LAUNCH(T, TV) \
  gdr_chunk_input_grads_kernel<T, TV><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(l, a)
  DD_GDR_CHUNK_DISPATCH(a.in_qk, a.in_v, DD_LAUNCH);
#undef DD_LAUNCH
  return static_cast<int>(cudaGetLastError());
}

#undef DD_GDR_CHUNK_DISPATCH
#undef DD_GDR_CHUNK_DISPATCH_V

}  // namespace kernels
