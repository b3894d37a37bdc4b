// The Gated DeltaNet's output norm, y_h = RMSNorm(o_h; w) ⊙ silu(z_h) per head (MODEL.md §4), as one
// op: on a GPU one CUDA kernel each way (kernels/gated_rmsnorm.h) reading the gate z in place from
// its projection's column slice and writing y straight in the dtype of the output projection that
// follows; elsewhere, and as the reference it is tested against, the ATen formula.
#pragma once

#include <torch/types.h>

namespace model {

// o [B,T,H,D] (fp32 or fp64: the delta rule's output; or bf16, its output under 16-bit training, in
// fp32 math with its gradient in bf16), z [B,T,H·D] (any dtype; may be a column slice
// of a wider tensor), w [D]. Returns y [B,T,H,D] in out_dtype; fp32 (fp64) math. Differentiable in
// o, z and w. Any thread; bad shapes throw c10::Error.
torch::Tensor gated_rms_norm_reference(const torch::Tensor& o, const torch::Tensor& z, const torch::Tensor& w,
                                       double eps, torch::ScalarType out_dtype);
torch::Tensor gated_rms_norm(const torch::Tensor& o, const torch::Tensor& z, const torch::Tensor& w, double eps,
                             torch::ScalarType out_dtype);

// The same norm of o given as rows in another order: o_rows [M, D] (fp32, fp64 or bf16) and o_row
// [B,T,H] int32, the row of o_rows that holds head h of token (b, t); rows no entry names (the
// delta rule's chunk padding) are read by nobody and get zero gradient. On a GPU the kernels read
// and write those rows in place, so o never exists in token order; elsewhere, and as the
// reference, o_rows.index_select(0, o_row) and the formula above. pad_rows (optional: int32 on
// o_rows' device) lists exactly the rows o_row does not name, when the caller has it (a fixed
// chunk layout's GdrChunkLayout::pad_rows): the backward then zeroes those rows' gradient by the
// list instead of working them out from o_row first. pad_rows_unread: nobody reads those rows of
// o_rows' gradient either (the delta rule's backward skips them by its row map, GdrOutput::
// o_pad_rows_unread), and the backward leaves them unwritten.
torch::Tensor gated_rms_norm_rows_reference(const torch::Tensor& o_rows, const torch::Tensor& o_row,
                                            const torch::Tensor& z, const torch::Tensor& w, double eps,
                                            torch::ScalarType out_dtype);
torch::Tensor gated_rms_norm_rows(const torch::Tensor& o_rows, const torch::Tensor& o_row, const torch::Tensor& z,
                                  const torch::Tensor& w, double eps, torch::ScalarType out_dtype,
                                  const torch::Tensor& pad_rows = {}, bool pad_rows_unread = false);
// Backwards so far in this process that zeroed the padding rows by pad_rows' list (for the tests).
int64_t gated_norm_padding_rows_by_list();
// Backwards so far that left the padding rows unwritten (pad_rows_unread; for the tests).
int64_t gated_norm_padding_rows_unread();

}  // namespace model
