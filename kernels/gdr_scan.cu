// The chunk-state scan of the gated delta rule (kernels/gdr_scan.h). One block (8 or 16 warps) owns
// one (document, head) and 32 columns of the state, one column per lane, and walks that document's
// chunks in order. The state lives in shared memory ([dk][32], one row per 128 bytes, so a warp's
// reads of a column are conflict-free); every thread owns a fixed run of state rows for its column.
// Per step:
//   phase 0  write the state this step starts from (out_state), while P [C, dk] and the block's
//            columns of A are in flight to shared memory (asynchronous copies issued at the end of
//            the step before);
//   phase 1  y = A + sign_p · P S: warp w computes chunk rows w, w + warps, ...;
//   phase 2  stage Q in P's buffer, then S = decay · S + sign_q · Qᵀ y + E, each thread updating
//            its own state rows; then issue the next step's copies.
// Staging matters: read straight from global memory, every inner-loop iteration waited on an L2
// round trip and the kernel was slower than the ATen loop it replaces (7.4 vs 6.4 ms for the whole
// delta rule at B=8, T=2048, H=16, d=128). The copies are cp.async, so all of a tile's loads are in
// flight at once rather than one per thread at a time. Reads of the staged tile are warp-wide
// broadcasts. All math in fp32 with fp32 accumulation.
#include <cuda_runtime.h>

#include "kernels/cp_async.cuh"
#include "kernels/gdr_scan.h"
#include "kernels/smem_opt_in.cuh"

namespace kernels {

namespace {

constexpr int kLanes = 32;  // state columns per block

// Starts copying n4 float4 from global to shared memory, all threads of the block.
__device__ __forceinline__ void stage_tile(float* dst, const float* src, int n4) {
  for (int k = threadIdx.x; k < n4; k += blockDim.x) cp_async16(dst + 4 * k, src + 4 * k);
}

// Starts copying the block's 32 columns (from j0) of the [C, dv] rows at src into y_s [C][32],
// in 4-column pieces (dv % 4 == 0, so a piece is either whole or past dv; those are skipped).
__device__ __forceinline__ void stage_columns(float* y_s, const float* src, int C, int64_t dv, int64_t j0) {
  for (int k = threadIdx.x; k < C * 8; k += blockDim.x) {
    const int c = k / 8, q = k % 8;
    if (j0 + 4 * q < dv) cp_async16(y_s + c * kLanes + 4 * q, src + c * dv + j0 + 4 * q);
  }
}

// kWarps: warps per block (16, or 8 on request: each step is a chain of dependent phases, so the
// step's latency is the time, and more warps split each phase's work thinner). RC: chunk rows per warp in phase 1 (C ≤ kWarps·RC). RPW:
// state rows per warp in phase 2 (dk ≤ kWarps·RPW, a multiple of 4 so a thread's rows are whole
// float4s of Q).
template <int kWarps, int RC, int RPW>
__global__ void __launch_bounds__(kLanes* kWarps) gdr_scan_kernel(GdrScanArgs a) {
  extern __shared__ float smem[];
  const int dk = static_cast<int>(a.dk), C = static_cast<int>(a.C);
  const int64_t dv = a.dv;
  float* S_s = smem;                     // [dk][32]
  float* y_s = S_s + dk * kLanes;        // [C][32]
  float* T_s = y_s + C * kLanes;         // [C][dk]: P, then Q, of the current step (16-byte aligned)
  const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
  const int64_t doc_head = blockIdx.x;
  const int64_t s = doc_head / a.H, head = doc_head % a.H;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kLanes + lane;
  const bool col = j < dv;
  const int i0 = warp * RPW;  // this thread's state rows: i0 .. i0 + RPW − 1 (those below dk)

#pragma unroll
  for (int g = 0; g < RPW; ++g) {
    const int i = i0 + g;
    if (i < dk) S_s[i * kLanes + lane] = (a.init != nullptr && col) ? a.init[(doc_head * dk + i) * dv + j] : 0.f;
  }
  __syncthreads();

  // A's columns come through y_s by asynchronous copies when dv allows 16-byte pieces.
  const bool stage_a = dv % 4 == 0;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * kLanes;
  const int n = a.n_chunks[s];
  auto row_of_step = [&](int t) {
    const int m = a.reverse ? n - 1 - t : t;
    return (static_cast<int64_t>(a.step_off[m]) + s) * a.H + head;
  };
  auto stage_step = [&](int64_t r) {  // the copies phase 1 of step r waits for
    stage_tile(T_s, a.P + r * C * dk, C * dk / 4);
    if (stage_a) stage_columns(y_s, a.A + r * C * dv, C, dv, j0);
  };
  if (n > 0) stage_step(row_of_step(0));
  for (int t = 0; t < n; ++t) {
    const int64_t r = row_of_step(t);

    // Phase 0: the state this step starts from (S_s is final since the last step's barrier).
    if (col) {
#pragma unroll
      for (int g = 0; g < RPW; ++g) {
        const int i = i0 + g;
        if (i < dk) a.out_state[(r * dk + i) * dv + j] = S_s[i * kLanes + lane];
      }
    }

    // Phase 1: y = A + sign_p · P S for chunk rows warp, warp + 8, ...
    cp_async_wait_all();
    __syncthreads();
    float acc[RC];
#pragma unroll
    for (int k = 0; k < RC; ++k) acc[k] = 0.f;
    const float* Pr = T_s;
    for (int i = 0; i < dk; i += 4) {
      const float s0 = S_s[i * kLanes + lane], s1 = S_s[(i + 1) * kLanes + lane];
      const float s2 = S_s[(i + 2) * kLanes + lane], s3 = S_s[(i + 3) * kLanes + lane];
#pragma unroll
      for (int k = 0; k < RC; ++k) {
        const int c = warp + kWarps * k;
        if (c < C) {
          const float4 p = *reinterpret_cast<const float4*>(Pr + c * dk + i);
          acc[k] += p.x * s0 + p.y * s1 + p.z * s2 + p.w * s3;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < RC; ++k) {
      const int c = warp + kWarps * k;
      if (c < C) {
        const int64_t at = (r * C + c) * dv + j;
        const float av = !col ? 0.f : stage_a ? y_s[c * kLanes + lane] : a.A[at];
        const float y = av + a.sign_p * acc[k];
        y_s[c * kLanes + lane] = y;
        if (col) a.out_y[at] = y;
      }
    }
    __syncthreads();

    // Phase 2: S = decay · S + sign_q · Qᵀ y + E for this thread's rows (P is no longer read).
    stage_tile(T_s, a.Q + r * C * dk, C * dk / 4);
    cp_async_wait_all();
    __syncthreads();
    float acc2[RPW];
#pragma unroll
    for (int g = 0; g < RPW; ++g) acc2[g] = 0.f;
    const float* Qr = T_s;
    for (int c = 0; c < C; ++c) {
      const float yv = y_s[c * kLanes + lane];
#pragma unroll
      for (int g = 0; g < RPW; g += 4) {
        const int i = i0 + g;
        if (i < dk) {
          const float4 q = *reinterpret_cast<const float4*>(Qr + c * dk + i);
          acc2[g] += q.x * yv;
          acc2[g + 1] += q.y * yv;
          acc2[g + 2] += q.z * yv;
          acc2[g + 3] += q.w * yv;
        }
      }
    }
    const float dec = __ldg(a.decay + r);
#pragma unroll
    for (int g = 0; g < RPW; ++g) {
      const int i = i0 + g;
      if (i < dk) {
        const float e = (a.E != nullptr && col) ? a.E[(r * dk + i) * dv + j] : 0.f;
        S_s[i * kLanes + lane] = dec * S_s[i * kLanes + lane] + a.sign_q * acc2[g] + e;
      }
    }
    __syncthreads();  // Q and y are read, S is final: the next step's copies may land
    if (t + 1 < n) stage_step(row_of_step(t + 1));
  }

  if (col) {
#pragma unroll
    for (int g = 0; g < RPW; ++g) {
      const int i = i0 + g;
      if (i < dk) a.final_state[(doc_head * dk + i) * dv + j] = S_s[i * kLanes + lane];
    }
  }
}

// Opts an instance in to more than 48 KiB of shared memory (once per device) and launches it.
template <int kWarps, int RC, int RPW>
void launch(const GdrScanArgs& a, dim3 grid, size_t smem, cudaStream_t st) {
  allow_dynamic_smem(reinterpret_cast<const void*>(gdr_scan_kernel<kWarps, RC, RPW>),
                     static_cast<int>(gdr_scan_smem_bytes(128, 256)));
  gdr_scan_kernel<kWarps, RC, RPW><<<grid, kLanes * kWarps, smem, st>>>(a);
}

// RC = C / kWarps rounded up to 8 or 16 rows (8 warps) or 4 or 8 (16 warps); RPW covers dk.
template <int kWarps, int RC>
int launch_rpw(const GdrScanArgs& a, dim3 grid, size_t smem, cudaStream_t st) {
  if (a.dk <= kWarps * 4) {
    launch<kWarps, RC, 4>(a, grid, smem, st);
  } else if (a.dk <= kWarps * 8) {
    launch<kWarps, RC, 8>(a, grid, smem, st);
  } else if (a.dk <= kWarps * 16) {
    launch<kWarps, RC, 16>(a, grid, smem, st);
  } else {
    launch<kWarps, RC, 32>(a, grid, smem, st);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int gdr_scan_tensor_core_width(const GdrScanArgs& a) {
  if (gdr_scan_reads_output_grad(a)) return gdr_scan_fused_width(a);
  if (a.variant == kGdrScanAuto) return gdr_scan_mma_width(a);
  const int fixed_cols = a.variant == kGdrScanTensorCores32    ? 32
                         : a.variant == kGdrScanTensorCores64  ? 64
                         : a.variant == kGdrScanTensorCores96  ? 96
                         : a.variant == kGdrScanTensorCores128 ? 128
                                                               : 0;
  return fixed_cols > 0 && gdr_scan_mma_supports(a.C, a.dk, a.dv, fixed_cols) ? fixed_cols : 0;
}

int gdr_scan(const GdrScanArgs& a, void* stream) {
  if (!gdr_scan_supports(a.C, a.dk) || a.n_docs < 1 || a.H < 1 || a.dv < 1) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  // The chunk output is written by the warp-column forward only, and needs all three pointers.
  const bool any_output = a.out_o_bf16 != nullptr || a.o_P_bf16 != nullptr || a.o_Qg_bf16 != nullptr;
  if (any_output && (a.out_o_bf16 == nullptr || a.o_P_bf16 == nullptr || a.o_Qg_bf16 == nullptr ||
                     gdr_scan_forward_output_width(a) == 0)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (gdr_scan_reads_output_grad(a)) {  // the fused backward form: tensor-core or warp-column kernels
    const int fused_cols = gdr_scan_fused_width(a);
    if (fused_cols == 0 || !gdr_scan_fused_form_ok(a)) return static_cast<int>(cudaErrorInvalidValue);
    if (a.bf16_products) {
      if (a.variant == kGdrScanAuto && gdr_scan_warp_columns() && gdr_scan_reverse_warps_width(a) > 0) {
        return gdr_scan_reverse_warps(a, stream);
      }
      return gdr_scan_fused_bf16(a, fused_cols, stream);
    }
    return gdr_scan_tensor_cores(a, fused_cols, stream);
  }
  if (a.bf16_products) {  // the fused form's, and the forward's bf16 form
    const int forward_cols = gdr_scan_forward_bf16_width(a);
    if (forward_cols == 0) return static_cast<int>(cudaErrorInvalidValue);
    if (a.variant == kGdrScanAuto && gdr_scan_warp_columns() && gdr_scan_forward_warps_width(a) > 0) {
      return gdr_scan_forward_warps(a, stream);
    }
    return gdr_scan_forward_bf16(a, forward_cols, stream);
  }
  const int cols = gdr_scan_tensor_core_width(a);
  if (cols > 0) return gdr_scan_tensor_cores(a, cols, stream);
  // The FMA kernels read and write fp32 only.
  if (a.out_state_bf16 != nullptr || a.out_y_bf16 != nullptr || a.P_bf16 != nullptr || a.Q_bf16 != nullptr ||
      a.A_bf16 != nullptr) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const dim3 grid(static_cast<unsigned>(a.n_docs * a.H), static_cast<unsigned>((a.dv + kLanes - 1) / kLanes));
  const size_t smem = gdr_scan_smem_bytes(a.C, a.dk);  // ≤ 176 KiB by the limits
  auto st = static_cast<cudaStream_t>(stream);
  if (a.variant != kGdrScanSimt8) return a.C <= 16 * 4 ? launch_rpw<16, 4>(a, grid, smem, st) : launch_rpw<16, 8>(a, grid, smem, st);
  return a.C <= 8 * 8 ? launch_rpw<8, 8>(a, grid, smem, st) : launch_rpw<8, 16>(a, grid, smem, st);
}

}  // namespace kernels
