#include "model/gdr_state_grads.h"

#include <torch/torch.h>

#include <atomic>

#include "model/bmm_fp32.h"

#if defined(DD_HAVE_CUDA)
#include "kernels/gdr_chunk_state_grads.h"
#include "model/kernel_dtype.h"
#endif

namespace model {
namespace {

std::atomic<bool> g_fuse{true};
std::atomic<int64_t> g_launches{0};
std::atomic<bool> g_bf16_products{true};
std::atomic<int64_t> g_bf16_launches{0};

torch::Tensor tr(const torch::Tensor& x) { return x.transpose(-1, -2); }

void check_inputs(const torch::Tensor& dO_src, const torch::Tensor& dO_rows, const torch::Tensor& dU,
                  const torch::Tensor& h_in, const torch::Tensor& dh_next, const torch::Tensor& v_new) {
  TORCH_CHECK(dU.dim() == 3 && h_in.dim() == 3 && dh_next.sizes() == h_in.sizes() && v_new.sizes() == dU.sizes() &&
                  h_in.size(0) == dU.size(0) && h_in.size(2) == dU.size(2),
              "gdr_state_grads: expected dU, v_new [R, C, dv] and h_in, dh_next [R, dk, dv], got dU ", dU.sizes(),
              ", v_new ", v_new.sizes(), ", h_in ", h_in.sizes(), ", dh_next ", dh_next.sizes());
  TORCH_CHECK(dO_src.dim() == 2 && dO_src.size(1) == dU.size(2), "gdr_state_grads: expected dO rows [n, ", dU.size(2),
              "], got ", dO_src.sizes());
  TORCH_CHECK(!dO_rows.defined() || dO_rows.numel() == dU.size(0) * dU.size(1),
              "gdr_state_grads: the row map has ", dO_rows.numel(), " entries for ", dU.size(0) * dU.size(1),
              " chunk rows");
  TORCH_CHECK(dO_rows.defined() || dO_src.size(0) == dU.size(0) * dU.size(1), "gdr_state_grads: dO has ",
              dO_src.size(0), " rows for ", dU.size(0) * dU.size(1), " chunk rows and no row map");
}

#if defined(DD_HAVE_CUDA)
bool bf16(const torch::Tensor& x) { return x.scalar_type() == torch::kBFloat16; }
const uint16_t* bits(const torch::Tensor& x) { return reinterpret_cast<const uint16_t*>(x.data_ptr()); }

// The kernel's arguments when it takes these inputs (fp32 dO, or bf16 beside a bf16 dU and bf16
// products; fp32 or bf16 dU, bf16 states, contiguous, on one GPU, sizes it supports), its products in
// bf16 if asked; else nothing is launched and `ok` is false.
kernels::GdrChunkStateGradsArgs kernel_args(const torch::Tensor& dO_src, const torch::Tensor& dO_rows,
                                            const torch::Tensor& dU, const torch::Tensor& h_in,
                                            const torch::Tensor& dh_next, const torch::Tensor& v_new,
                                            bool bf16_products, bool& ok) {
  kernels::GdrChunkStateGradsArgs a;
  const auto f32 = torch::kFloat32;
  const auto dev = dU.device();
  const bool map_ok = !dO_rows.defined() || (dO_rows.device() == dev && dO_rows.scalar_type() == torch::kInt32 &&
                                               dO_rows.is_contiguous());
  const bool devices_ok = dU.is_cuda() && dO_src.device() == dev && h_in.device() == dev &&
                          dh_next.device() == dev && v_new.device() == dev;
  const bool dO_ok = dO_src.scalar_type() == f32 || (bf16(dO_src) && bf16(dU) && bf16_products);
  const bool dtypes_ok = dO_ok && (dU.scalar_type() == f32 || bf16(dU)) && bf16(h_in) && bf16(dh_next) && bf16(v_new);
  const bool contiguous = dO_src.is_contiguous() && dU.is_contiguous() && h_in.is_contiguous() &&
                          dh_next.is_contiguous() && v_new.is_contiguous();
  ok = g_fuse && devices_ok && map_ok && dtypes_ok && contiguous;
  if (!ok) return a;
  a.R = dU.size(0);
  a.C = static_cast<int>(dU.size(1));
  a.dk = static_cast<int>(h_in.size(1));
  a.dv = static_cast<int>(dU.size(2));
  a.dO = dO_src.data_ptr();
  a.dO_bf16 = bf16(dO_src);
  a.dO_rows = dO_rows.defined() ? dO_rows.data_ptr<int32_t>() : nullptr;
  a.dU = dU.data_ptr();
  a.dU_bf16 = bf16(dU);
  a.h_in = bits(h_in);
  a.dh_next = bits(dh_next);
  a.v_new = bits(v_new);
  a.bf16_products = bf16_products;
  ok = kernels::gdr_chunk_state_grads_supports(a);
  return a;
}
#endif

}  // namespace

GdrStateGrads gdr_state_grads_reference(const torch::Tensor& dO_src, const torch::Tensor& dO_rows,
                                        const torch::Tensor& dU, const torch::Tensor& h_in,
                                        const torch::Tensor& dh_next, const torch::Tensor& v_new, double scale) {
  check_inputs(dO_src, dO_rows, dU, h_in, dh_next, v_new);
  const int64_t R = dU.size(0), C = dU.size(1);
  GdrStateGrads out;
  auto from_dO = [&](const auto& dOr) {  // dOr: [R, C, dv] chunk rows, or GatheredRows
    out.dP_raw = bmm_fp32(dOr, tr(v_new));
    out.dQg = bmm_fp32(dOr, tr(h_in), scale);
  };
  if (dO_rows.defined()) {
    from_dO(GatheredRows{dO_src, dO_rows, R, C});
  } else {
    from_dO(dO_src.view({R, C, dO_src.size(1)}));
  }
  out.dW = bmm_fp32(dU, tr(h_in), -1.0);
  out.dKd = bmm_fp32(v_new, tr(dh_next));
  out.ddecay = row_dot_fp32(h_in, dh_next);
  return out;
}

GdrStateGrads gdr_state_grads(const torch::Tensor& dO_src, const torch::Tensor& dO_rows, const torch::Tensor& dU,
                              const torch::Tensor& h_in, const torch::Tensor& dh_next, const torch::Tensor& v_new,
                              double scale, bool bf16_out, const torch::Tensor& chunk_len, int64_t heads) {
  check_inputs(dO_src, dO_rows, dU, h_in, dh_next, v_new);
#if defined(DD_HAVE_CUDA)
  bool ok = false;
  auto a = kernel_args(dO_src, dO_rows, dU, h_in, dh_next, v_new, bf16_out && g_bf16_products, ok);
  // A bf16 dO the kernel's form for these inputs does not read as it is (an fp32 dU, the TF32
  // products, a dv of 8 mod 16): widened, exactly, for the kernel rather than the reference.
  torch::Tensor dO_widened;
  if (!ok && dO_src.scalar_type() == torch::kBFloat16) {
    dO_widened = dO_src.to(torch::kFloat32);
    a = kernel_args(dO_widened, dO_rows, dU, h_in, dh_next, v_new, bf16_out && g_bf16_products, ok);
  }
  if (ok) {
    const int64_t R = a.R, C = a.C, dk = a.dk;
    const auto opts = dU.options().dtype(torch::kFloat32), dk_opts = bf16_out ? opts.dtype(torch::kBFloat16) : opts;
    GdrStateGrads out{torch::empty({R, C, C}, opts), torch::empty({R, C, dk}, dk_opts),
                      torch::empty({R, C, dk}, dk_opts), torch::empty({R, C, dk}, dk_opts), torch::empty({R}, opts)};
    a.scale = static_cast<float>(scale);
    a.dP_raw = out.dP_raw.data_ptr<float>();
    a.dQg = out.dQg.data_ptr();
    a.dW = out.dW.data_ptr();
    a.dKd = out.dKd.data_ptr();
    a.bf16_out = bf16_out;
    a.ddecay = out.ddecay.data_ptr<float>();
    if (chunk_len.defined()) {
      TORCH_CHECK(chunk_len.scalar_type() == torch::kInt32 && chunk_len.is_contiguous() &&
                      chunk_len.device() == dU.device() && chunk_len.numel() * heads == R,
                  "gated delta rule state products: chunk_len must be int32 [rows / heads] on dU's device");
      a.chunk_len = chunk_len.data_ptr<int32_t>();
      a.heads = heads;
    }
    check_kernel_launch(kernels::gdr_chunk_state_grads(a, stream_of(dU)), "gated delta rule state products");
    ++g_launches;
    if (kernels::gdr_chunk_state_grads_bf16_form(a)) ++g_bf16_launches;
    return out;
  }
#endif
  // A bf16 dO widened (exactly) for the products the kernel's paths do not take.
  const auto dO_f = dO_src.scalar_type() == torch::kBFloat16 ? dO_src.to(torch::kFloat32) : dO_src;
  auto out = gdr_state_grads_reference(dO_f, dO_rows, dU, h_in, dh_next, v_new, scale);
  if (bf16_out) {
    out.dQg = out.dQg.to(torch::kBFloat16);
    out.dW = out.dW.to(torch::kBFloat16);
    out.dKd = out.dKd.to(torch::kBFloat16);
  }
  return out;
}

void gdr_fuse_state_grads(bool on) { g_fuse = on; }

int64_t gdr_state_grads_launches() { return g_launches.load(); }

void gdr_bf16_state_grads_products(bool on) { g_bf16_products = on; }

int64_t gdr_state_grads_bf16_launches() { return g_bf16_launches.load(); }

}  // namespace model
