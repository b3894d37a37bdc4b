#include "model/fused_gated_norm.h"

#include <torch/torch.h>

#include <atomic>
#include <optional>
#include <vector>

#include "model/fused_rmsnorm.h"

#if defined(DD_HAVE_CUDA)
#include "kernels/column_sum.h"
#include "kernels/gated_rmsnorm.h"
#include "kernels/zero_rows.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {

std::atomic<int64_t> g_pad_rows_by_list{0};
std::atomic<int64_t> g_pad_rows_unread{0};

// o: o's sizes in token order, [B,T,H,D].
void check_shapes(at::IntArrayRef o, const torch::Tensor& z, const torch::Tensor& w) {
  TORCH_CHECK(o.size() == 4, "gated_rms_norm: expected o [B,T,H,D], got ", o);
  TORCH_CHECK(z.dim() == 3 && z.size(0) == o[0] && z.size(1) == o[1] && z.size(2) == o[2] * o[3],
              "gated_rms_norm: expected z [B,T,H·D] for o ", o, ", got ", z.sizes());
  TORCH_CHECK(w.dim() == 1 && w.size(0) == o[3], "gated_rms_norm: expected w [", o[3], "], got ", w.sizes());
}

void check_rows(const torch::Tensor& o_rows, const torch::Tensor& o_row) {
  TORCH_CHECK(o_rows.dim() == 2, "gated_rms_norm_rows: expected o_rows [M,D], got ", o_rows.sizes());
  TORCH_CHECK(o_row.dim() == 3 && o_row.scalar_type() == torch::kInt32,
              "gated_rms_norm_rows: expected o_row [B,T,H] int32, got ", o_row.sizes(), " ", o_row.scalar_type());
}

// The token-order sizes [B,T,H,D] of rows of width D picked by o_row [B,T,H].
std::vector<int64_t> token_order_sizes(const torch::Tensor& o_row, int64_t D) {
  auto sizes = o_row.sizes().vec();
  sizes.push_back(D);
  return sizes;
}

// o_rows' rows in token order: [B,T,H,D].
torch::Tensor gather_rows(const torch::Tensor& o_rows, const torch::Tensor& o_row) {
  return o_rows.index_select(0, o_row.reshape({-1}).to(torch::kInt64)).view(token_order_sizes(o_row, o_rows.size(1)));
}

}  // namespace

torch::Tensor gated_rms_norm_reference(const torch::Tensor& o, const torch::Tensor& z, const torch::Tensor& w,
                                       double eps, torch::ScalarType out_dtype) {
  check_shapes(o.sizes(), z, w);
  // fp32 math for a 16-bit o (its gradient comes back in o's dtype through the cast).
  const auto ft = o.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto zf = z.reshape(o.sizes()).to(ft);
  auto y = rms_norm_reference(o.to(ft), w.to(ft), eps) * torch::silu(zf);
  return y.to(out_dtype);
}

torch::Tensor gated_rms_norm_rows_reference(const torch::Tensor& o_rows, const torch::Tensor& o_row,
                                            const torch::Tensor& z, const torch::Tensor& w, double eps,
                                            torch::ScalarType out_dtype) {
  check_rows(o_rows, o_row);
  return gated_rms_norm_reference(gather_rows(o_rows, o_row), z, w, eps, out_dtype);
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::DType dtype_of(torch::ScalarType t) { return checked_kernel_dtype(t, "gated RMSNorm kernels"); }

// The rows as the kernels address them: H rows of D per token, z's tokens z.stride(1) apart; o's
// rows where o_row says (when defined) or in token order. y_sizes: [B,T,H,D].
kernels::GatedNormRows rows_of(at::IntArrayRef y_sizes, const torch::Tensor& z, const torch::Tensor& o_row) {
  kernels::GatedNormRows r;
  r.D = y_sizes[3];
  r.N = y_sizes[0] * y_sizes[1] * y_sizes[2];
  r.z_heads = y_sizes[2];
  r.z_ld = z.stride(1);
  r.o_row = o_row.defined() ? o_row.data_ptr<int32_t>() : nullptr;
  return r;
}


// An uninitialised tensor laid out as z [B, T, C] is: rows of z.stride(1) columns in one buffer of
// B·T such rows, z at its column offset in them (the kernel writes dz in z's layout). Where z is a
// column slice of a wider projection output (the Gated DeltaNet's output gate beside the short
// conv's channels), the conv's backward then fills the other columns of this buffer instead of
// copying dz into a buffer of its own (model/fused_short_conv.cpp).
torch::Tensor gradient_like_slice(const torch::Tensor& z) {
  const int64_t B = z.size(0), T = z.size(1), C = z.size(2), ld = z.stride(1);
  const int64_t col = ld > 0 ? z.storage_offset() % ld : 0;
  // Set on the storage, not a view of a buffer tensor: a view keeps its base alive, and the conv
  // parts' backward takes the buffer only when this gradient is its one holder.
  auto storage = torch::empty({B * T * ld}, z.options()).storage();
  return torch::empty({0}, z.options()).set_(storage, col + C <= ld ? col : 0, z.sizes(), {T * ld, ld, 1});
}

// o: [B,T,H,D] in token order (no o_row), or rows [M,D] with o_row [B,T,H] int32 saying where
// each (token, head) is. (An optional, not an undefined tensor: autograd takes every tensor
// argument for an input and asks it for its device.)
class GatedRmsNormFn : public torch::autograd::Function<GatedRmsNormFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& o, const torch::Tensor& z,
                               const torch::Tensor& w, double eps, int64_t out_dtype,
                               const std::optional<torch::Tensor>& o_row,
                               const std::optional<torch::Tensor>& pad_rows, bool pad_rows_unread) {
    const auto yt = static_cast<torch::ScalarType>(out_dtype);
    auto oc = o.contiguous();
    auto row = o_row.has_value() ? o_row->contiguous() : torch::Tensor();
    auto wf = w.to(torch::kFloat32).contiguous();
    const auto y_sizes = row.defined() ? token_order_sizes(row, o.size(1)) : o.sizes().vec();
    auto y = torch::empty(y_sizes, o.options().dtype(yt));
    const auto rows = rows_of(y.sizes(), z, row);
    auto rstd = torch::empty({rows.N}, o.options().dtype(torch::kFloat32));
    check_kernel_launch(kernels::gated_rmsnorm_forward(y.data_ptr(), dtype_of(yt), rstd.data_ptr<float>(), oc.data_ptr(),
                                                       dtype_of(oc.scalar_type()), z.data_ptr(),
                                                       dtype_of(z.scalar_type()), wf.data_ptr<float>(), rows,
                                                       static_cast<float>(eps), stream_of(o)),
                        "gated RMSNorm forward");
    ctx->save_for_backward({oc, z, wf, rstd});
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    if (row.defined()) ctx->saved_data["o_row"] = row;
    if (pad_rows.has_value()) ctx->saved_data["pad_rows"] = *pad_rows;
    ctx->saved_data["pad_rows_unread"] = pad_rows_unread;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &o = saved[0], &z = saved[1], &wf = saved[2], &rstd = saved[3];
    const auto row = ctx->saved_data.count("o_row") ? ctx->saved_data["o_row"].toTensor() : torch::Tensor();
    auto dy = grads[0].contiguous();
    const auto rows = rows_of(dy.sizes(), z, row);
    // Rows of o no (token, head) reads (chunk padding) get zero gradient, written by a pass over
    // those rows alone, or are left unwritten where their one reader skips them (pad_rows_unread);
    // a permutation of o's rows writes every one.
    auto d_o = torch::empty_like(o);
    if (ctx->saved_data["pad_rows_unread"].toBool()) {
      ++g_pad_rows_unread;  // left unwritten: their one reader skips them
    } else if (row.defined() && rows.N != o.size(0) && ctx->saved_data.count("pad_rows")) {
      const auto pad = ctx->saved_data["pad_rows"].toTensor();
      const int err = o.scalar_type() == torch::kFloat32
                          ? kernels::zero_listed_rows_f32(d_o.data_ptr<float>(), o.size(1), pad.data_ptr<int32_t>(),
                                                          pad.numel(), stream_of(o))
                          : kernels::zero_listed_rows_16bit(d_o.data_ptr(), o.size(1), pad.data_ptr<int32_t>(),
                                                            pad.numel(), stream_of(o));
      check_kernel_launch(err, "gated RMSNorm backward: padding rows by list");
      ++g_pad_rows_by_list;
    } else if (row.defined() && rows.N != o.size(0)) {
      auto named = torch::empty({o.size(0)}, o.options().dtype(torch::kUInt8));
      const int32_t* row_of = row.data_ptr<int32_t>();
      uint8_t* marks = named.data_ptr<uint8_t>();
      const int err = o.scalar_type() == torch::kFloat32
                          ? kernels::zero_unnamed_rows_f32(d_o.data_ptr<float>(), o.size(0), o.size(1), row_of,
                                                           row.numel(), marks, stream_of(o))
                          : kernels::zero_unnamed_rows_16bit(d_o.data_ptr(), o.size(0), o.size(1), row_of,
                                                             row.numel(), marks, stream_of(o));
      check_kernel_launch(err, "gated RMSNorm backward: padding rows");
    }
    auto dz = gradient_like_slice(z);
    auto partial = torch::empty({kernels::gated_rmsnorm_backward_partial_rows(rows.N), rows.D},
                                o.options().dtype(torch::kFloat32));
    check_kernel_launch(kernels::gated_rmsnorm_backward(d_o.data_ptr(), dz.data_ptr(), partial.data_ptr<float>(),
                                                        dy.data_ptr(), dtype_of(dy.scalar_type()), o.data_ptr(),
                                                        dtype_of(o.scalar_type()), z.data_ptr(),
                                                        dtype_of(z.scalar_type()), wf.data_ptr<float>(),
                                                        rstd.data_ptr<float>(), rows, stream_of(o)),
                        "gated RMSNorm backward");
    auto dw = torch::empty({rows.D}, partial.options());
    check_kernel_launch(kernels::column_sum_f32(dw.data_ptr<float>(), partial.data_ptr<float>(), partial.size(0),
                                                rows.D, stream_of(o)),
                        "gated RMSNorm weight gradient");
    dw = dw.to(static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt()));
    return {d_o, dz, dw, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The kernels take fp32 o on a GPU (or bf16 o beside bf16 z and y), z with unit column stride and a
// token stride that covers the batch (z[b, t] at (b·T + t) · stride(1)) with rows that do not overlap
// (dz is written in z's layout), and widths up to 1024.
bool kernels_apply(const torch::Tensor& o, const torch::Tensor& z, const torch::Tensor& w, torch::ScalarType out) {
  kernels::DType o_dt{}, z_dt{}, y_dt{};
  return o.is_cuda() && z.is_cuda() && w.is_cuda() && kernel_dtype(o.scalar_type(), o_dt) &&
         kernel_dtype(z.scalar_type(), z_dt) && kernel_dtype(out, y_dt) &&
         kernels::gated_rmsnorm_takes_o(o_dt, y_dt, z_dt) && z.stride(2) == 1 && z.stride(1) >= z.size(2) &&
         (z.size(0) == 1 || z.stride(0) == z.size(1) * z.stride(1)) &&
         kernels::gated_rmsnorm_supports(o.size(o.dim() - 1)) && o.numel() > 0;
}

}  // namespace
#endif

torch::Tensor gated_rms_norm(const torch::Tensor& o, const torch::Tensor& z, const torch::Tensor& w, double eps,
                             torch::ScalarType out_dtype) {
  check_shapes(o.sizes(), z, w);
#if defined(DD_HAVE_CUDA)
  if (kernels_apply(o, z, w, out_dtype)) {
    return GatedRmsNormFn::apply(o, z, w, eps, static_cast<int64_t>(out_dtype), std::nullopt, std::nullopt, false);
  }
#endif
  return gated_rms_norm_reference(o, z, w, eps, out_dtype);
}

torch::Tensor gated_rms_norm_rows(const torch::Tensor& o_rows, const torch::Tensor& o_row, const torch::Tensor& z,
                                  const torch::Tensor& w, double eps, torch::ScalarType out_dtype,
                                  const torch::Tensor& pad_rows, bool pad_rows_unread) {
  check_rows(o_rows, o_row);
#if defined(DD_HAVE_CUDA)
  if (o_row.is_cuda() && o_row.numel() > 0 && kernels_apply(o_rows, z, w, out_dtype)) {
    check_shapes(token_order_sizes(o_row, o_rows.size(1)), z, w);
    // The padding rows' list only as its producer describes it: int32 on o_rows' device, one row
    // for each row o_row leaves out.
    const bool list = pad_rows.defined() && pad_rows.is_cuda() && pad_rows.device() == o_rows.device() &&
                      pad_rows.scalar_type() == torch::kInt32 && pad_rows.dim() == 1 && pad_rows.is_contiguous() &&
                      pad_rows.numel() + o_row.numel() == o_rows.size(0);
    return GatedRmsNormFn::apply(o_rows, z, w, eps, static_cast<int64_t>(out_dtype),
                                 std::optional<torch::Tensor>(o_row),
                                 list ? std::optional<torch::Tensor>(pad_rows) : std::nullopt, pad_rows_unread);
  }
#endif
  return gated_rms_norm_rows_reference(o_rows, o_row, z, w, eps, out_dtype);
}

int64_t gated_norm_padding_rows_by_list() { return g_pad_rows_by_list.load(); }
int64_t gated_norm_padding_rows_unread() { return g_pad_rows_unread.load(); }

}  // namespace model
