// `deltadeck bench train`: the whole training step of a preset on synthetic tokens (random:), run
// through the real engine (every rank, precision, optimizer), checkpoints and evaluation off.
// Prints the median step time, tokens/s, MFU and peak memory after a warm-up, as a table and JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace app {

struct BenchTrainArgs {
  std::string preset = "small";
  std::string family = "hybrid";
  std::string precision = "bf16";
  std::string devices = "auto";
  int64_t steps = 30;                   // timed steps after the warm-up
  int64_t warmup = 10;
  int64_t batch_size = 8;               // rows per rank and micro-step
  int64_t seq_len = 1024;
  std::vector<std::string> overrides;   // --set section.key=value
  std::string json_path;                // also write the JSON object here
  bool profile = false;                 // after the timed steps, profile 3 more and print the breakdown
  std::string profile_trace;            // and save the profiler's trace here (JSON)
  int64_t profile_top = 20;             // kernels listed in the profile, the most GPU time first
  // One of gdr_scan_choices(): the delta rule core's CUDA kernels as training runs them, one piece
  // swapped for the form it is measured against, or their ATen twins.
  std::string gdr_scan = "kernel";
  // fp8 only: "fused" (the SwiGLU feed-forward as one fp8 function, model/fp8_swiglu_mlp.h) or
  // "unfused" (its three layers one by one), to measure the fusion.
  std::string fp8_ffn = "fused";
  // "default", or "baseline": the add+RMSNorm kernels moving one column per load, the cross-entropy
  // kernel keeping bf16 rows in registers and the gated norm's looped kernels (their stop-26
  // forms), to measure the change.
  std::string row_kernels = "default";
  // "default" (LibTorch's pick for dense attention: cuDNN on Hopper), "flash" or "cudnn": the
  // scaled-dot-product attention backend of the dense path, to compare them.
  std::string sdpa = "default";
  // "fused" (model::rope_qkv's one autograd node) or "split" (RoPE on q and k each, split's backward
  // concatenating the gradients), to measure the fusion.
  std::string rope_qkv = "fused";
  // "fused" (model::mla_qkv's one kernel each way) or "split" (RoPE, cat, expand and pad as ATen ops).
  std::string mla_qkv = "fused";
  // "auto" (dense attention hands cuDNN MLA's V unpadded where SDPA picks cuDNN; packed rows hand
  // it as the K|V projection's own columns), "copied" (unpadded, but copied out of those columns,
  // model::mla_values_in_kv) or "padded" (V zero-padded to the q/k head width for every backend;
  // model::attention_narrow_values).
  std::string mla_values = "auto";
  // "one-gemm" (MLA's first products as one GEMM each way, model::mla_first_products_in_one_gemm) or
  // "per-group" (one GEMM a group), to measure it.
  std::string mla_first_products = "one-gemm";
  // "kernel" (a fused product's parts' gradients into its gradient rows by one kernel,
  // model::split_gradient_columns_kernel) or "aten" (a copy_ a part), to measure it.
  std::string split_gradients = "kernel";
  // "cudnn" (packed rows on cuDNN's kernel where it takes the shape, model/cudnn_attention.h) or
  // "flash" (FlashAttention-2's varlen kernel, V padded), to compare them.
  std::string packed_attention = "cudnn";
  // "in-place" (the linear layers' bf16 products write their weight gradients into the fp32 .grad,
  // model/mixed_linear.h) or "autograd" (autocast's products, their bf16 weight gradients cast to
  // fp32 and accumulated by autograd), to measure the change.
  std::string weight_grads = "in-place";
  // "ours" (kernels/adamw.h) or "aten" (ATen's fused multi-tensor AdamW): the CUDA optimizer
  // update, to measure the change.
  std::string adamw = "ours";
  // "ours" (kernels/muon_update.h) or "aten" (ATen's ops): Muon's momenta and update on a GPU, to
  // measure the change.
  std::string muon_kernels = "ours";
  // "on" (the in-place weight gradients' GEMMs on a second stream, overlapping the backward) or
  // "off" (on the backward's own stream), to measure the overlap.
  std::string weight_grad_stream = "on";
  // "no-workspace" (a CUDA-graph step's in-place products run cuBLAS without its workspace, so
  // without semaphore memsets) or "workspace", to measure it.
  std::string graph_gemms = "no-workspace";
  // "whole-row" (the delta rule's state products with a bf16 dO stage each operand only while a pass
  // needs it, one block for all of a row's dk columns: two blocks an SM at hybrid base), "tight" (the
  // same with a block for each half of dk: three blocks an SM) or "staged" (dh_next staged with dO
  // from the start), the last two to measure them.
  std::string state_products = "whole-row";
  // "on" (the delta rule's solve backward at hybrid base's heads with its copies overlapping its
  // products) or "off" (the general bf16-tile instance), to measure it.
  std::string solve_overlap = "on";
  // "on" (the delta rule's front at fixed head sizes takes q, k and v by 16-byte cp.async)
  // or "off" (through registers), to measure it.
  std::string chunk_copies = "on";
  // "fast" (the delta rule's front and tail at fixed head sizes take their masks' decays by
  // ex2.approx) or "exact" (expf), to measure it.
  std::string chunk_decay = "fast";
  std::string weight_shadows = "on";  // on | off: bf16 weight copies kept by AdamW (model/weight_shadow.h)
  std::string expert_weights = "in-place";  // in-place | autograd: MoE experts' products (model/expert_product.h)
  std::string grad_norm = "producers";  // producers | read: where the clipping norm's sums of squares come from
  // pieces | scatter: MoE expert gradients left in bf16 pieces for AdamW, or written to .grad
  std::string expert_grads = "pieces";
  // in-front | in-core | separate: the Gated DeltaNet's L2Norm of q and k inside the delta rule's
  // op (its backward in the tail kernel, model::GdrQkNorm), its forward in the front kernel
  // (model::gdr_l2norm_in_front) or in the norm's own kernel, or as an op of its own, to measure it.
  std::string gdn_l2norm = "in-front";
  // in-projection | apart: the Gated DeltaNet's a|b gate projection in the q|k|v|g product's GEMM
  // or a GEMM of its own each way (model::gdn_gates_in_projection), to measure it.
  std::string gdn_gates = "in-projection";
  // beside-scan | here | aside: the Gated DeltaNet's output projection's weight-gradient GEMM put off
  // until the delta rule's reverse scan and run beside it (model::gdn_output_weight_grad_beside_scan;
  // beside-scan-8 and -36 with cuBLAS's kernel picked for that many SMs), or on the backward's own
  // stream, or on the second one beside the gated norm's backward
  // (model::gdn_output_weight_grad_on_caller_stream), the others to measure them.
  std::string gdn_output_wgrad = "beside-scan";
  std::string moe_weights = "swiglu";  // swiglu | combine: where the MoE applies its router weights (model/moe.h)
  std::string moe_inputs = "fused";  // fused | separate: the MoE input's fan-out and fan-in (model/moe_dispatch.h)
  // "auto" (the default rule), "off" (one piece per expert) or a row count: the pieces the MoE
  // experts' weight-gradient product cuts each expert's rows into (model/expert_product.h).
  std::string expert_grad_pieces = "auto";
};

// The values of bench train's --gdr-scan, each with what it runs (its help text): "kernel" first.
struct GdrScanChoice {
  const char* value;
  const char* what;
};
const std::vector<GdrScanChoice>& gdr_scan_choices();

// Returns the exit code: 0 measured, 2 bad arguments or config, 1 the run failed.
int bench_train(const BenchTrainArgs& args);

}  // namespace app
