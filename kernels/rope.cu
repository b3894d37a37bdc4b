// RoPE: one block per token (b, t); its threads walk the token's rotation pairs of every part
// (RopeParts: q and k, or q, k and v, in one launch), V consecutive pairs per thread through one
// aligned vector load of each half (16 bytes where aligned, else 8, else scalars), so the token's
// position and its cos/sin row are read once (staged in shared memory as fp32) and a warp touches
// one contiguous stretch of each head.
#include <type_traits>

#include "kernels/elem.cuh"
#include "kernels/rope.h"

namespace kernels {

namespace {

// Part k of p, picked by branches: a dynamic index into the kernel's parameter array would copy
// the array to local memory.
__device__ __forceinline__ const RopePart& part_of(const RopeParts& p, int k) {
  static_assert(kRopeMaxParts == 6, "part_of picks among six parts");
  return k < 3 ? (k == 0 ? p.part[0] : (k == 1 ? p.part[1] : p.part[2]))
               : (k == 3 ? p.part[3] : (k == 4 ? p.part[4] : p.part[5]));
}

// A part's head width and the number of V-pair vectors per head.
__device__ __forceinline__ int part_width(const RopeParts& p, const RopePart& pt) {
  return static_cast<int>(pt.D != 0 ? pt.D : p.D);
}

template <typename T, int V>
__global__ void rope_parts_kernel(RopeParts p, const int64_t* pos, const double* cos_t, const double* sin_t,
                                  float sign) {
  extern __shared__ float table[];  // [2, D/2]
  const int64_t token = blockIdx.x;
  const int64_t b = token / p.T, t = token % p.T;
  const int rot_half = static_cast<int>(p.D / 2);
  // Vectors of V pairs in part k: H · (D_k / 2) / V.
  auto vectors = [&](int k) {
    const RopePart& pt = part_of(p, k);
    return static_cast<int>(pt.H) * (part_width(p, pt) / 2 / V);
  };
  int total = 0;
  for (int k = 0; k < p.n; ++k) total += vectors(k);
  // Vector i's part, head and first pair, and its two halves' loads.
  struct Item {
    int k = 0, hd = 0, j = 0;
  };
  auto locate = [&](int i) {
    Item it;
    int w = i;
    while (w >= vectors(it.k)) w -= vectors(it.k), ++it.k;
    const int per_head = part_width(p, part_of(p, it.k)) / 2 / V;
    it.hd = w / per_head;
    it.j = (w % per_head) * V;
    return it;
  };
  auto load = [&](const Item& it, Vec<T, V>& x1, Vec<T, V>& x2) {
    const RopePart& pt = part_of(p, it.k);
    const int half = part_width(p, pt) / 2;
    if (pt.x != nullptr) {
      const T* xh = static_cast<const T*>(pt.x) + b * pt.x_sb + t * pt.x_st + it.hd * pt.x_sh;
      x1.load(xh + it.j);
      x2.load(xh + it.j + half);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        x1.set(e, 0.f);
        x2.set(e, 0.f);
      }
    }
  };
  auto rotate_and_store = [&](const Item& it, const Vec<T, V>& x1, const Vec<T, V>& x2) {
    const RopePart& pt = part_of(p, it.k);
    const int width = part_width(p, pt), half = width / 2, j = it.j;
    Vec<T, V> o1, o2;
    if (pt.rotate && pt.x != nullptr) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float c = table[j + e], sn = table[rot_half + j + e];
        o1.set(e, x1.get(e) * c - x2.get(e) * sn);
        o2.set(e, x2.get(e) * c + x1.get(e) * sn);
      }
    } else {
      o1 = x1;
      o2 = x2;
    }
    T* oh = static_cast<T*>(pt.out) + token * pt.out_st +
            static_cast<int64_t>(it.hd) * (pt.out_sh != 0 ? pt.out_sh : width);
    o1.store(oh + j);
    o2.store(oh + j + half);
  };
  // The thread's first vector is loaded before the token's position and table, which it does not
  // need until the rotation: its loads and the position's and table's are in flight together,
  // where they took three memory latencies one after another (a block has a token's few hundred
  // bytes of work, so those latencies set its time).
  Item first;
  Vec<T, V> x1, x2;
  if (static_cast<int>(threadIdx.x) < total) {
    first = locate(threadIdx.x);
    load(first, x1, x2);
  }
  // The token's cos and sign·sin as fp32, converted once here: every head of every part reads the
  // same row, and converting the fp64 tables per element held the kernel well under the bandwidth.
  const int64_t ps = pos[b * p.pos_sb + t * p.pos_st];
  for (int j = threadIdx.x; j < rot_half; j += blockDim.x) {
    table[j] = static_cast<float>(cos_t[ps * rot_half + j]);
    table[rot_half + j] = sign * static_cast<float>(sin_t[ps * rot_half + j]);
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < total) rotate_and_store(first, x1, x2);
  for (int i = threadIdx.x + blockDim.x; i < total; i += blockDim.x) {
    const Item it = locate(i);
    load(it, x1, x2);
    rotate_and_store(it, x1, x2);
  }
}

// RoPE + per-head RMSNorm. G threads own one head (G = (D/2)/V, a power of two ≤ 32, so a head's
// threads are G consecutive lanes of one warp and reduce with shuffles). The loop runs over whole
// blocks of heads so every lane of a warp reaches the shuffles; lanes past the last head carry 0.
template <typename T, int V, int G>
__global__ void rope_rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const int64_t* pos, const double* cos_t,
                                            const double* sin_t, RopeShape s, float eps) {
  const int64_t token = blockIdx.x;
  const int64_t b = token / s.T, t = token % s.T;
  const int64_t half = s.D / 2;
  const int64_t p = pos[b * s.pos_sb + t * s.pos_st];
  const T* xt = x + b * s.x_sb + t * s.x_st;
  const int64_t work = s.H * G, span = (work + blockDim.x - 1) / blockDim.x * blockDim.x;
  for (int64_t i = threadIdx.x; i < span; i += blockDim.x) {
    const bool active = i < work;
    const int64_t hd = i / G, j = (i % G) * V;
    float o1[V], o2[V];
    float ss = 0.f;
    if (active) {
      Vec<T, V> x1, x2;
      x1.load(xt + hd * s.x_sh + j);
      x2.load(xt + hd * s.x_sh + j + half);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float c = static_cast<float>(cos_t[p * half + j + k]), sn = static_cast<float>(sin_t[p * half + j + k]);
        o1[k] = x1.get(k) * c - x2.get(k) * sn;
        o2[k] = x2.get(k) * c + x1.get(k) * sn;
        ss += o1[k] * o1[k] + o2[k] * o2[k];
      }
    }
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (!active) continue;
    const float r = rsqrtf(ss / static_cast<float>(s.D) + eps);
    if (i % G == 0) rstd[token * s.H + hd] = r;
    Vec<T, V> y1, y2;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      y1.set(k, o1[k] * r);
      y2.set(k, o2[k] * r);
    }
    T* yh = y + (token * s.H + hd) * s.D;
    y1.store(yh + j);
    y2.store(yh + j + half);
  }
}

// One thread's V rotation pairs of a head in the backward of RoPE + QK-norm: load takes dy's and
// y's two halves (columns j.. and j + half..) and returns the thread's share of the head's Σ dy·y;
// store writes rope⁻¹(r · (dy − y · m)) with m = Σ dy·y / D, the rotation rows at the token's
// position. Shared by both backward kernels, so the two give the same bits.
template <typename T, int V>
struct RopeNormGrad {
  Vec<T, V> d1, d2, y1, y2;
  __device__ __forceinline__ float load(const T* dy_head, const T* y_head, int64_t j, int64_t half) {
    d1.load(dy_head + j);
    d2.load(dy_head + j + half);
    y1.load(y_head + j);
    y2.load(y_head + j + half);
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) dot += d1.get(k) * y1.get(k) + d2.get(k) * y2.get(k);
    return dot;
  }
  __device__ __forceinline__ void store(T* dx_head, int64_t j, int64_t half, float r, float m, const double* cos_row,
                                        const double* sin_row) const {
    Vec<T, V> g1, g2;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float z1 = r * (d1.get(k) - y1.get(k) * m), z2 = r * (d2.get(k) - y2.get(k) * m);
      const float c = static_cast<float>(cos_row[j + k]), sn = static_cast<float>(sin_row[j + k]);
      // The inverse rotation (by −θ).
      g1.set(k, z1 * c + z2 * sn);
      g2.set(k, z2 * c - z1 * sn);
    }
    g1.store(dx_head + j);
    g2.store(dx_head + j + half);
  }
};

template <typename T, int V, int G>
__global__ void rope_rmsnorm_backward_kernel(T* dx, const T* dy, const T* y, const float* rstd, const int64_t* pos,
                                             const double* cos_t, const double* sin_t, RopeShape s) {
  const int64_t token = blockIdx.x;
  const int64_t b = token / s.T, t = token % s.T;
  const int64_t half = s.D / 2;
  const int64_t p = pos[b * s.pos_sb + t * s.pos_st];
  const int64_t work = s.H * G, span = (work + blockDim.x - 1) / blockDim.x * blockDim.x;
  for (int64_t i = threadIdx.x; i < span; i += blockDim.x) {
    const bool active = i < work;
    const int64_t hd = i / G, j = (i % G) * V;
    const int64_t base = (token * s.H + hd) * s.D;
    RopeNormGrad<T, V> pairs;
    float dot = active ? pairs.load(dy + base, y + base, j, half) : 0.f;
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (!active) continue;
    pairs.store(dx + base, j, half, rstd[token * s.H + hd], dot / static_cast<float>(s.D), cos_t + p * half,
                sin_t + p * half);
  }
}

// rope_rmsnorm_backward_kernel's work for the q and k heads of a fused projection, written into
// the q|k|v gradient's row, with the v heads' gradient copied beside them (rope_rmsnorm_qkv_backward).
// The token's heads in the row's order, G threads each: q's nh, k's nkv, v's nkv; a head's G
// threads are G consecutive items, so the group's dot product reduces within a warp as there.
template <typename T, int V, int G>
__global__ void rope_rmsnorm_qkv_backward_kernel(RopeNormQkvGrads g, const int64_t* pos, const double* cos_t,
                                                 const double* sin_t) {
  const int64_t token = blockIdx.x;
  const int64_t b = token / g.T, t = token % g.T;
  const int64_t half = g.D / 2;
  const int64_t p = pos[b * g.pos_sb + t * g.pos_st];
  const int64_t heads = g.nh + 2 * g.nkv, work = heads * G, span = (work + blockDim.x - 1) / blockDim.x * blockDim.x;
  T* row = static_cast<T*>(g.dqkv) + token * heads * g.D;
  for (int64_t i = threadIdx.x; i < span; i += blockDim.x) {
    const bool active = i < work;
    const int64_t hd = i / G, j = (i % G) * V;  // hd: the head's place in the row
    const bool is_q = hd < g.nh, is_v = hd >= g.nh + g.nkv;
    const int64_t H = is_q ? g.nh : g.nkv, h = is_q ? hd : (is_v ? hd - g.nh - g.nkv : hd - g.nh);
    const T* dy = static_cast<const T*>(is_q ? g.dq : g.dk);
    const T* y = static_cast<const T*>(is_q ? g.yq : g.yk);
    const bool norm = !is_v && dy != nullptr;  // a q or k head with a gradient
    const int64_t base = (token * H + h) * g.D;
    RopeNormGrad<T, V> pairs;
    float dot = active && norm ? pairs.load(dy + base, y + base, j, half) : 0.f;
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (!active) continue;
    T* out = row + hd * g.D;
    if (norm) {
      pairs.store(out, j, half, (is_q ? g.rstd_q : g.rstd_k)[token * H + h], dot / static_cast<float>(g.D),
                  cos_t + p * half, sin_t + p * half);
      continue;
    }
    // v's gradient copied, or zeros for a missing gradient.
    Vec<T, V> v1, v2;
    if (is_v && g.dv != nullptr) {
      const T* src = static_cast<const T*>(g.dv) + b * g.dv_sb + t * g.dv_st + h * g.dv_sh;
      v1.load(src + j);
      v2.load(src + j + half);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v1.set(k, 0.f);
        v2.set(k, 0.f);
      }
    }
    v1.store(out + j);
    v2.store(out + j + half);
  }
}

// Threads per head for a head of D: (D/2)/V when that is a power of two ≤ 32, else 0.
template <typename T, int V>
int threads_per_head(int64_t D) {
  if (D % 2 != 0 || (D / 2) % V != 0) return 0;
  const int64_t g = (D / 2) / V;
  return (g >= 1 && g <= 32 && (g & (g - 1)) == 0) ? static_cast<int>(g) : 0;
}

// Calls f(T{}, V, G) as compile-time constants for a supported head layout; false otherwise.
template <typename F>
bool dispatch_rope_norm(DType dt, const RopeShape& s, F&& f) {
  bool ok = false;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 8 / sizeof(T);
    switch (threads_per_head<T, V>(s.D)) {
#define DD_ROPE_G(G_)                                                                     \
  case G_:                                                                               \
    f(tag, std::integral_constant<int, V>{}, std::integral_constant<int, G_>{});          \
    ok = true;                                                                            \
    break;
      DD_ROPE_G(1) DD_ROPE_G(2) DD_ROPE_G(4) DD_ROPE_G(8) DD_ROPE_G(16) DD_ROPE_G(32)
#undef DD_ROPE_G
      default: break;
    }
  });
  return ok;
}

int block_for(int64_t work) { return work >= 256 ? 256 : static_cast<int>((work + 31) / 32 * 32); }

}  // namespace

bool rope_rmsnorm_supported(DType dt, const RopeShape& s, const void* x) {
  bool ok = false;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 8 / sizeof(T);
    ok = threads_per_head<T, V>(s.D) > 0 && s.x_sb % V == 0 && s.x_st % V == 0 && s.x_sh % V == 0 &&
         aligned_to(8, x);
  });
  return ok;
}

int rope_rmsnorm_forward(void* y, float* rstd, const void* x, DType dt, const int64_t* pos, const double* cos,
                         const double* sin, const RopeShape& s, float eps, void* stream) {
  if (s.B * s.T == 0 || s.H == 0) return 0;
  if (!rope_rmsnorm_supported(dt, s, x) || !aligned_to(8, y)) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_rope_norm(dt, s, [&](auto tag, auto vec, auto grp) {
    using T = decltype(tag);
    constexpr int V = decltype(vec)::value, G = decltype(grp)::value;
    rope_rmsnorm_forward_kernel<T, V, G><<<static_cast<unsigned>(s.B * s.T), block_for(s.H * G), 0, st>>>(
        static_cast<T*>(y), rstd, static_cast<const T*>(x), pos, cos, sin, s, eps);
  });
  return static_cast<int>(cudaGetLastError());
}

int rope_rmsnorm_backward(void* dx, const void* dy, const void* y, const float* rstd, DType dt, const int64_t* pos,
                          const double* cos, const double* sin, const RopeShape& s, void* stream) {
  if (s.B * s.T == 0 || s.H == 0) return 0;
  if (!aligned_to(8, dx, dy, y)) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  const bool ok = dispatch_rope_norm(dt, s, [&](auto tag, auto vec, auto grp) {
    using T = decltype(tag);
    constexpr int V = decltype(vec)::value, G = decltype(grp)::value;
    rope_rmsnorm_backward_kernel<T, V, G><<<static_cast<unsigned>(s.B * s.T), block_for(s.H * G), 0, st>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(y), rstd, pos, cos, sin, s);
  });
  if (!ok) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaGetLastError());
}

int rope_rmsnorm_qkv_backward(const RopeNormQkvGrads& g, DType dt, const int64_t* pos, const double* cos,
                              const double* sin, void* stream) {
  if (g.B * g.T == 0) return 0;
  const int64_t elem = dt == DType::F32 ? 4 : 2, v = 8 / elem;
  const bool dv_ok =
      g.dv == nullptr || (aligned_to(8, g.dv) && g.dv_sb % v == 0 && g.dv_st % v == 0 && g.dv_sh % v == 0);
  if (g.dqkv == nullptr || g.nh < 1 || g.nkv < 1 || !aligned_to(8, g.dqkv, g.dq, g.dk) || !aligned_to(8, g.yq, g.yk) ||
      !dv_ok ||
      (g.dq != nullptr && (g.yq == nullptr || g.rstd_q == nullptr)) ||
      (g.dk != nullptr && (g.yk == nullptr || g.rstd_k == nullptr))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  RopeShape s{};
  s.D = g.D;
  auto st = static_cast<cudaStream_t>(stream);
  const bool ok = dispatch_rope_norm(dt, s, [&](auto tag, auto vec, auto grp) {
    using T = decltype(tag);
    constexpr int V = decltype(vec)::value, G = decltype(grp)::value;
    rope_rmsnorm_qkv_backward_kernel<T, V, G>
        <<<static_cast<unsigned>(g.B * g.T), block_for((g.nh + 2 * g.nkv) * G), 0, st>>>(g, pos, cos, sin);
  });
  if (!ok) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaGetLastError());
}

int rope_apply_parts(const RopeParts& p, DType dt, const int64_t* pos, const double* cos, const double* sin,
                     bool inverse, void* stream) {
  if (p.n < 1 || p.n > kRopeMaxParts || p.D % 2 != 0) return static_cast<int>(cudaErrorInvalidValue);
  int64_t pairs = 0;
  for (int k = 0; k < p.n; ++k) {
    const RopePart& q = p.part[k];
    const int64_t width = q.D != 0 ? q.D : p.D;
    if (width % 2 != 0 || (q.rotate && q.x != nullptr && width != p.D)) return static_cast<int>(cudaErrorInvalidValue);
    pairs += q.H * (width / 2);
  }
  if (p.B * p.T == 0 || pairs == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  const float sign = inverse ? -1.f : 1.f;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    // 16-byte vectors when every row start, head start and the half split are aligned to them, else
    // 8-byte ones, else scalars.
    auto fits = [&](int v) {
      bool ok = (p.D / 2) % v == 0;
      for (int k = 0; k < p.n; ++k) {
        const RopePart& q = p.part[k];
        ok = ok && ((q.D != 0 ? q.D : p.D) / 2) % v == 0 && q.x_sb % v == 0 && q.x_st % v == 0 && q.x_sh % v == 0 &&
             q.out_st % v == 0 && q.out_sh % v == 0 && aligned_to(v * static_cast<int>(sizeof(T)), q.out, q.x);
      }
      return ok;
    };
    constexpr int kWide = 16 / sizeof(T), kNarrow = 8 / sizeof(T);
    const int v = fits(kWide) ? kWide : (fits(kNarrow) ? kNarrow : 1);
    const int64_t work = pairs / v;
    const int threads = work >= 256 ? 256 : static_cast<int>((work + 31) / 32 * 32);
    const unsigned grid = static_cast<unsigned>(p.B * p.T);
    const size_t smem = sizeof(float) * static_cast<size_t>(p.D);
    if (v == kWide) rope_parts_kernel<T, kWide><<<grid, threads, smem, st>>>(p, pos, cos, sin, sign);
    else if (v == kNarrow) rope_parts_kernel<T, kNarrow><<<grid, threads, smem, st>>>(p, pos, cos, sin, sign);
    else rope_parts_kernel<T, 1><<<grid, threads, smem, st>>>(p, pos, cos, sin, sign);
  });
  return static_cast<int>(cudaGetLastError());
}

int rope_apply(void* out, const void* x, DType dt, const int64_t* pos, const double* cos, const double* sin,
               const RopeShape& s, bool inverse, void* stream) {
  if (s.B * s.T == 0 || s.H == 0 || s.D == 0) return 0;
  RopeParts p;
  p.B = s.B;
  p.T = s.T;
  p.D = s.D;
  p.pos_sb = s.pos_sb;
  p.pos_st = s.pos_st;
  p.n = 1;
  p.part[0] = RopePart{x, s.x_sb, s.x_st, s.x_sh, s.H, out, s.H * s.D, true};
  return rope_apply_parts(p, dt, pos, cos, sin, inverse, stream);
}

}  // namespace kernels
