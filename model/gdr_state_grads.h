// The gated delta rule backward's products with the saved chunk states (notation of
// model/gdr_chunk_core.cpp; rows r = chunk · H + head, s = scale):
//   dP_raw = dO Vnᵀ,  dQg = s dO h_inᵀ,  dW = −dU h_inᵀ,  dKd = Vn dh_nextᵀ,  ddecay = Σ h_in ⊙ dh_next.
// On a GPU with the states in bf16 one kernel takes all five (kernels/gdr_chunk_state_grads.h);
// the reference is four batched products and a row dot (model/bmm_fp32.h), also the path for
// everything the kernel does not take.
#pragma once

#include <torch/types.h>

namespace model {

struct GdrStateGrads {
  torch::Tensor dP_raw;  // [R, C, C]
  torch::Tensor dQg;     // [R, C, dk]
  torch::Tensor dW;      // [R, C, dk]
  torch::Tensor dKd;     // [R, C, dk]
  torch::Tensor ddecay;  // [R]
};

// dO_src [n, dv] fp32 (or bf16: the 16-bit path's output gradient, which the kernel's bf16 products
// with a bf16 dU read as it is, and everything else widens) holds the output gradient's rows: chunk
// row r·C + i is row dO_rows[r·C + i]
// (int32, −1 for zeros), or row r·C + i when dO_rows is undefined. dU [R, C, dv] fp32 or bf16;
// h_in, dh_next [R, dk, dv] and v_new [R, C, dv] fp32 or bf16. Results fp32; with bf16_out dQg, dW
// and dKd are rounded to bf16 (the fused backward's 16-bit mode, model::gdr_bf16_chunk_grads), and
// the kernel then takes its products in bf16 (gdr_bf16_state_grads_products below). chunk_len
// (int32 [R / heads] on the GPU, optional): the kernel leaves the rows of chunks of length 0
// unwritten (row r is chunk r / heads's), for callers whose readers skip those chunks too (the fused
// backward under a fixed layout, whose spare chunks have no tokens).
GdrStateGrads gdr_state_grads(const torch::Tensor& dO_src, const torch::Tensor& dO_rows, const torch::Tensor& dU,
                              const torch::Tensor& h_in, const torch::Tensor& dh_next, const torch::Tensor& v_new,
                              double scale, bool bf16_out = false, const torch::Tensor& chunk_len = {},
                              int64_t heads = 1);
// The same by the batched products and the row dot, whatever the device.
GdrStateGrads gdr_state_grads_reference(const torch::Tensor& dO_src, const torch::Tensor& dO_rows,
                                        const torch::Tensor& dU, const torch::Tensor& h_in,
                                        const torch::Tensor& dh_next, const torch::Tensor& v_new, double scale);

// Process-wide switch (default on) for benchmarks and tests: off, gdr_state_grads always takes
// the reference's products. Any thread.
void gdr_fuse_state_grads(bool on);
// How many times this process has launched the kernel (tests check the path was taken).
int64_t gdr_state_grads_launches();

// Process-wide switch (default on) for benchmarks and tests: on, the kernel's launches with bf16_out
// take their products as bf16 mma, dO (and an fp32 dU) rounded to bf16 as an operand, 2⁻⁹ relative,
// as dQg, dW and dKd are then rounded themselves (dP_raw stays fp32; the tail's bf16 products round
// what it makes of it); off, as TF32 mma (2⁻¹¹). Any thread.
void gdr_bf16_state_grads_products(bool on);
// How many of the kernel's launches took the bf16 products.
int64_t gdr_state_grads_bf16_launches();

}  // namespace model
