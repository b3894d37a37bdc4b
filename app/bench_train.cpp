#include "app/bench_train.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <tuple>
#include <variant>

#include <ATen/Context.h>
#include <nlohmann/json.hpp>

#include "kernels/gdr_chunk_solve_backward.h"
#include "kernels/gdr_chunk_state_grads.h"
#include "kernels/gdr_head_sizes.h"
#include "kernels/gdr_scan.h"
#include "model/bmm_fp32.h"
#include "model/cudnn_attention.h"
#include "model/gdr_chunk_core.h"
#if defined(DD_HAVE_CUDA)
#include "kernels/cross_entropy.h"
#include "kernels/gated_rmsnorm.h"
#include "kernels/l2_norm.h"
#include "kernels/rmsnorm_train.h"
#endif
#include "model/fp8_swiglu_mlp.h"
#include "model/fused_rope.h"
#include "model/gdr.h"
#include "model/gdr_scan.h"
#include "model/gdr_state_grads.h"
#include "model/layers.h"
#include "model/mla.h"
#include "model/expert_product.h"
#include "model/expert_grads_in_pieces.h"
#include "model/grad_square_sums.h"
#include "model/mixed_linear.h"
#include "model/moe.h"
#include "model/moe_dispatch.h"
#include "model/weight_shadow.h"
#include "storage/file_util.h"
#include "trainer/adamw.h"
#include "trainer/muon.h"
#include "trainer/config.h"
#include "trainer/session.h"

namespace app {

namespace {

constexpr int64_t kProfileSteps = 3;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

const std::vector<GdrScanChoice>& gdr_scan_choices() {
  static const std::vector<GdrScanChoice> choices = {
      {"kernel", "the delta rule core's CUDA kernels, as training runs them"},
      {"unfused", "without the fused ones (forward front, backward through the solve)"},
      {"narrow-products", "its batched products in 64-column block tiles"},
      {"narrow-scan", "the state scan in blocks of 32 columns instead of the width picked for the shape"},
      {"scan-64", "the state scan in blocks of 64 columns"},
      {"scan-96", "the state scan in blocks of 96 columns"},
      {"scan-128", "the state scan in blocks of 128 columns"},
      {"fma-scan", "the state scan in fp32 FMA instead of tensor cores"},
      {"block-scan", "both bf16 scans' block kernels (warps sharing the state) instead of warps owning its columns"},
      {"warp-scan-64", "the bf16 scans' warp-column kernels in blocks of 64 columns"},
      {"warp-scan-128", "the bf16 scans' warp-column kernels in blocks of 128 columns"},
      {"wgmma-scan", "the forward bf16 scan on warpgroup products (wgmma) instead of the warp-column kernel"},
      {"thread-copies",
       "the bf16 scans' warp-column kernels with every thread copying and a block barrier a step, not two copy warps"},
      {"zeroed-pad-rows",
       "the output norm's backward zeroing the delta rule's padding rows, which its backward then reads, instead of "
       "the backward skipping them by a row map"},
      {"token-order", "its output copied into token order before the output norm"},
      {"fp32-states", "the scan's saved states in fp32 instead of bf16"},
      {"fp32-front", "the fused front's outputs in fp32 instead of bf16"},
      {"split-solve",
       "the fused backward through the solve with its fp32 operands split in two TF32 parts instead of rounded to TF32"},
      {"fp32-qk", "the layer's q and k in fp32 instead of the activations' 16-bit dtype"},
      {"products-then-scan", "the output gradient's two products into the reverse scan run before it, not inside it"},
      {"output-product", "the delta rule's output as a product after the forward scan, not inside it"},
      {"recompute-front", "the backward recomputing the front's outputs instead of reading the forward's"},
      {"state-gemms", "the backward's products with the chunk states as four GEMMs and a row dot, not one kernel"},
      {"dv-in-tail", "v's gradient from the backward's tail instead of the solve's backward"},
      {"fp32-grads", "the backward's dQg, dKd, dW and dRw in fp32 instead of bf16"},
      {"tf32-reverse-scan", "the reverse scan's products in TF32 instead of bf16"},
      {"tf32-forward-scan", "the forward scan's products in TF32 instead of bf16"},
      {"tf32-state-grads", "the backward's products with the chunk states in TF32 instead of bf16"},
      {"tf32-bf16-gemms",
       "the batched products of two bf16 operands (the delta rule's output) as TF32 mma instead of bf16"},
      {"fp32-solve-tiles", "the solve's backward with fp32 tiles of dW, dU, k and v and TF32 products, not bf16"},
      {"split-tail", "the backward tail's dq and dk products in split TF32 instead of bf16"},
      {"aten", "their ATen twins (to measure the kernels)"},
  };
  return choices;
}

int bench_train(const BenchTrainArgs& a) {
  if (a.steps < 1 || a.warmup < 0) {
    std::cerr << "deltadeck: bench train: --steps must be >= 1 and --warmup >= 0\n";
    return 2;
  }
  // The state scan's kernel per --gdr-scan value (kernels::GdrScanVariant); the others take the default.
  const std::map<std::string, int> scan_variants = {{"narrow-scan", kernels::kGdrScanTensorCores32},
                                                    {"scan-64", kernels::kGdrScanTensorCores64},
                                                    {"scan-96", kernels::kGdrScanTensorCores96},
                                                    {"scan-128", kernels::kGdrScanTensorCores128},
                                                    {"fma-scan", kernels::kGdrScanSimt16}};
  const auto& choices = gdr_scan_choices();
  if (std::none_of(choices.begin(), choices.end(), [&](const GdrScanChoice& c) { return a.gdr_scan == c.value; })) {
    std::string values;
    for (size_t i = 0; i < choices.size(); ++i) values += (i == 0 ? "" : ", ") + std::string(choices[i].value);
    std::cerr << "deltadeck: bench train: --gdr-scan: expected one of " << values << "; got \"" << a.gdr_scan << "\"\n";
    return 2;
  }
  // The measuring switches: each flag and the values it takes, the first being the default.
  const std::vector<std::tuple<const char*, const std::string*, std::vector<std::string>>> switches = {
      {"--fp8-ffn", &a.fp8_ffn, {"fused", "unfused"}},
      {"--row-kernels", &a.row_kernels, {"default", "baseline", "register-norm", "warp-l2", "row-a-warp-norm", "block-narrow-norm"}},
      {"--sdpa", &a.sdpa, {"default", "flash", "cudnn"}},
      {"--rope-qkv", &a.rope_qkv, {"fused", "split"}},
      {"--mla-qkv", &a.mla_qkv, {"fused", "split"}},
      {"--mla-values", &a.mla_values, {"auto", "copied", "padded"}},
      {"--mla-first-products", &a.mla_first_products, {"one-gemm", "per-group"}},
      {"--split-gradients", &a.split_gradients, {"kernel", "aten"}},
      {"--packed-attention", &a.packed_attention, {"cudnn", "flash"}},
      {"--weight-grads", &a.weight_grads, {"in-place", "autograd"}},
      {"--adamw", &a.adamw, {"ours", "aten"}},
      {"--muon-kernels", &a.muon_kernels, {"ours", "aten"}},
      {"--weight-grad-stream", &a.weight_grad_stream, {"on", "off"}},
      {"--graph-gemms", &a.graph_gemms, {"no-workspace", "workspace"}},
      {"--state-products", &a.state_products, {"tight", "staged", "whole-row"}},
      {"--solve-overlap", &a.solve_overlap, {"on", "off"}},
      {"--chunk-copies", &a.chunk_copies, {"on", "off"}},
      {"--chunk-decay", &a.chunk_decay, {"fast", "exact"}},
      {"--weight-shadows", &a.weight_shadows, {"on", "off"}},
      {"--expert-weights", &a.expert_weights, {"in-place", "autograd"}},
      {"--moe-inputs", &a.moe_inputs, {"fused", "separate"}},
      {"--moe-weights", &a.moe_weights, {"swiglu", "combine"}},
      {"--grad-norm", &a.grad_norm, {"producers", "read"}},
      {"--expert-grads", &a.expert_grads, {"pieces", "scatter"}},
      {"--gdn-l2norm", &a.gdn_l2norm, {"in-front", "in-core", "separate"}},
      {"--gdn-gates", &a.gdn_gates, {"in-projection", "apart"}},
      {"--gdn-output-wgrad", &a.gdn_output_wgrad, {"beside-scan", "here", "aside", "beside-scan-8", "beside-scan-36"}},
  };
  for (const auto& [flag, value, choices] : switches) {
    if (std::find(choices.begin(), choices.end(), *value) != choices.end()) continue;
    std::cerr << "deltadeck: bench train: " << flag << ": expected ";
    for (size_t i = 0; i < choices.size(); ++i)
      std::cerr << (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") << choices[i];
    std::cerr << ", got \"" << *value << "\"\n";
    return 2;
  }
  model::rope_qkv_fused(a.rope_qkv == "fused");
  model::mla_qkv_fused(a.mla_qkv == "fused");
  model::attention_narrow_values(a.mla_values != "padded");
  model::mla_values_in_kv(a.mla_values == "auto");
  model::mla_first_products_in_one_gemm(a.mla_first_products == "one-gemm");
  model::split_gradient_columns_kernel(a.split_gradients == "kernel");
  model::packed_attention_cudnn(a.packed_attention == "cudnn");
  model::weight_grads_in_place(a.weight_grads == "in-place");
  trainer::AdamW::use_own_kernel(a.adamw == "ours");
  trainer::Muon::use_own_kernels(a.muon_kernels == "ours");
  model::weight_grad_stream(a.weight_grad_stream == "on");
  model::gemms_without_workspace(a.graph_gemms == "no-workspace");
#if defined(DD_HAVE_CUDA)
  kernels::gdr_chunk_state_grads_tight(a.state_products != "staged");
  kernels::gdr_chunk_state_grads_whole_row(a.state_products == "whole-row");
  kernels::gdr_chunk_solve_backward_overlap(a.solve_overlap == "on");
  kernels::gdr_chunk_copies16(a.chunk_copies == "on");
  kernels::gdr_chunk_fast_decay(a.chunk_decay == "fast");
#endif
  model::weight_shadows(a.weight_shadows == "on");
  model::expert_products(a.expert_weights == "in-place");
  model::moe_inputs_fusion(a.moe_inputs == "fused");
  model::moe_router_weights_in_swiglu(a.moe_weights == "swiglu");
  model::producer_grad_square_sums(a.grad_norm == "producers");
  model::expert_grads_in_pieces_allowed(a.expert_grads == "pieces");
  model::gdn_l2norm_in_core(a.gdn_l2norm != "separate");
  model::gdr_l2norm_in_front(a.gdn_l2norm == "in-front");
  model::gdn_gates_in_projection(a.gdn_gates == "in-projection");
  model::gdn_output_weight_grad_on_caller_stream(a.gdn_output_wgrad == "here");
  {  // beside-scan[-SMS]: the SM count cuBLAS targets (0: all); here and aside: −1
    const std::string beside = "beside-scan";
    const auto& w = a.gdn_output_wgrad;
    model::gdn_output_weight_grad_beside_scan(
        w.rfind(beside, 0) != 0 ? -1 : w.size() == beside.size() ? 0 : std::stoi(w.substr(beside.size() + 1)));
  }
  {
    int64_t piece_rows = -1;
    if (a.expert_grad_pieces == "off") {
      piece_rows = 0;
    } else if (a.expert_grad_pieces != "auto") {
      char* end = nullptr;
      const long long v = std::strtoll(a.expert_grad_pieces.c_str(), &end, 10);
      if (a.expert_grad_pieces.empty() || *end != '\0' || v < 1 || v > (1LL << 30)) {
        std::cerr << "deltadeck: bench train: --expert-grad-pieces: expected auto, off or a row count from 1 to 2^30, "
                     "got \"" << a.expert_grad_pieces << "\"\n";
        return 2;
      }
      piece_rows = v;
    }
    model::expert_grad_piece_rows(piece_rows);
  }
  if (a.sdpa == "flash") {
    at::globalContext().setSDPUseCuDNN(false);
    at::globalContext().setSDPUseMemEfficient(false);
  }
  if (a.sdpa == "cudnn") {
    at::globalContext().setSDPUseFlash(false);
    at::globalContext().setSDPUseMemEfficient(false);
  }
#if defined(DD_HAVE_CUDA)
  kernels::add_rmsnorm_vector_loads(a.row_kernels != "baseline");
  kernels::add_rmsnorm_narrow_rows(a.row_kernels != "baseline" && a.row_kernels != "block-narrow-norm");
  kernels::cross_entropy_staged_rows(a.row_kernels != "baseline");
  kernels::gated_rmsnorm_register_rows(a.row_kernels != "baseline");
  kernels::gated_rmsnorm_staged_rows(a.row_kernels != "baseline" && a.row_kernels != "register-norm");
  kernels::gated_rmsnorm_grouped_rows(a.row_kernels == "default" || a.row_kernels == "warp-l2" ||
                                      a.row_kernels == "block-narrow-norm");
  kernels::l2_norm_pair_rows(a.row_kernels != "baseline" && a.row_kernels != "warp-l2");
  // block-scan: the bf16 scans' block kernels; warp-scan-64|128: the warp-column kernels' width.
  kernels::gdr_scan_warp_columns(a.gdr_scan != "block-scan");
  kernels::gdr_scan_warp_width(a.gdr_scan == "warp-scan-64" ? 64 : a.gdr_scan == "warp-scan-128" ? 128 : 0);
  kernels::gdr_scan_wgmma(a.gdr_scan == "wgmma-scan");
  kernels::gdr_scan_copy_warps(a.gdr_scan != "thread-copies");
#endif
  model::fp8_swiglu_mlp_enabled(a.fp8_ffn == "fused");
  model::gdr_use_kernels(a.gdr_scan != "aten");
  // unfused-front: the forward's front as six launches instead of the fused kernel.
  model::gdr_use_fused_kernels(a.gdr_scan != "unfused");
  // narrow-products: the batched fp32 products in 64-column block tiles (model/bmm_fp32.h).
  model::bmm_fp32_wide_tiles(a.gdr_scan != "narrow-products");
  // token-order: the delta rule's output copied into token order before the output norm.
  model::gdr_output_as_rows(a.gdr_scan != "token-order");
  model::gdr_output_grad_row_map(a.gdr_scan != "zeroed-pad-rows");
  // fp32-states: the scan's saved states and corrected values in fp32 under TF32 products.
  model::gdr_bf16_states(a.gdr_scan != "fp32-states");
  // fp32-front: the fused front's W, U, Kd, Qg and P in fp32 under TF32 products.
  model::gdr_bf16_front(a.gdr_scan != "fp32-front");
  // split-solve: the solve's backward kernel with its fp32 operands split in two TF32 parts under
  // TF32 products (rounded to TF32 by default).
  model::gdr_tf32_chunk_products(a.gdr_scan != "split-solve");
  // fp32-qk: the Gated DeltaNet layer's q and k in fp32 under 16-bit training (bf16 by default).
  model::gdn_qk_in_activation_dtype(a.gdr_scan != "fp32-qk");
  // products-then-scan: the backward's products of dO into the values' and states' gradients as
  // two launches before the reverse scan, instead of inside it (model::gdr_scan_fuse_output_grads).
  model::gdr_scan_fuse_output_grads(a.gdr_scan != "products-then-scan");
  // output-product: the chunk output as its own product after the forward scan (model::gdr_output_in_scan).
  model::gdr_output_in_scan(a.gdr_scan != "output-product");
  // recompute-front: the backward runs the fused front again for Kd, Qg, P and decay instead of
  // reading the forward's (model::gdr_save_front).
  model::gdr_save_front(a.gdr_scan != "recompute-front");
  // state-gemms: the backward's products with the chunk states (dP_raw, dQg, dW, dKd, the decay's
  // row dot) as four batched GEMMs and a row dot instead of one kernel (model::gdr_fuse_state_grads).
  model::gdr_fuse_state_grads(a.gdr_scan != "state-gemms");
  // dv-in-tail: v's gradient from dRu in the backward's tail instead of in the solve's backward
  // (model::gdr_dv_in_solve).
  model::gdr_dv_in_solve(a.gdr_scan != "dv-in-tail");
  // fp32-grads: the fused backward's dQg, dKd, dW and dRw in fp32 instead of bf16
  // (model::gdr_bf16_chunk_grads).
  model::gdr_bf16_chunk_grads(a.gdr_scan != "fp32-grads");
  // tf32-reverse-scan: the reverse scan's products in TF32 instead of bf16 (model::gdr_bf16_scan_products).
  model::gdr_bf16_scan_products(a.gdr_scan != "tf32-reverse-scan");
  // tf32-forward-scan: the forward scan's products in TF32 instead of bf16
  // (model::gdr_bf16_forward_scan_products).
  model::gdr_bf16_forward_scan_products(a.gdr_scan != "tf32-forward-scan");
  // tf32-state-grads: the backward's products with the chunk states (dQg, dP_raw, dW, dKd) as TF32
  // mma instead of bf16 (model::gdr_bf16_state_grads_products).
  model::gdr_bf16_state_grads_products(a.gdr_scan != "tf32-state-grads");
  // tf32-bf16-gemms: the batched products of two bf16 operands (the delta rule's output product)
  // as TF32 mma on the widened values instead of bf16 mma (model::bmm_fp32_bf16_mma).
  model::bmm_fp32_bf16_mma(a.gdr_scan != "tf32-bf16-gemms");
  // split-tail: the backward tail's dq and dk products in split TF32 instead of bf16
  // (model::gdr_bf16_tail_products).
  model::gdr_bf16_tail_products(a.gdr_scan != "split-tail");
  // fp32-solve-tiles: the solve's backward with dW, dU, k and v widened into fp32 tiles and dTm's
  // products as TF32 mma instead of bf16 tiles and bf16 mma (model::gdr_bf16_solve_tiles).
  model::gdr_bf16_solve_tiles(a.gdr_scan != "fp32-solve-tiles");
  const auto variant = scan_variants.find(a.gdr_scan);
  model::gdr_scan_variant(variant != scan_variants.end() ? variant->second : kernels::kGdrScanAuto);
  const std::string tmp = storage::files::make_temp_dir("deltadeck-bench");
  std::vector<std::string> o = {
      "name=\"bench\"",
      "model.family=\"" + a.family + "\"",
      "model.preset=\"" + a.preset + "\"",
      "data.train=[\"random:1000000\"]",
      "data.val=0.0001",
      "data.eot_token=0",
      "train.steps=" + std::to_string(a.steps + a.warmup + (a.profile ? kProfileSteps : 0)),
      "train.warmup_steps=0",
      "train.batch_size=" + std::to_string(a.batch_size),
      "train.seq_len=" + std::to_string(a.seq_len),
      "model.max_seq_len=" + std::to_string(a.seq_len),
      "train.precision=\"" + a.precision + "\"",
      "run.devices=\"" + a.devices + "\"",
      "run.log_interval=1",
      "run.eval_interval=0",
      "run.save_interval=0",
      "run.runs_dir=\"" + tmp + "\"",
  };
  o.insert(o.end(), a.overrides.begin(), a.overrides.end());
  auto parsed = trainer::parse_config("", "bench train", o);
  if (!parsed.ok()) {
    for (const auto& e : parsed.errors) std::cerr << "deltadeck: bench train: " << e << "\n";
    return 2;
  }
  trainer::RunConfig cfg = parsed.config;
  auto unresolved = trainer::resolve_config(cfg);
  if (!unresolved.empty()) {
    for (const auto& e : unresolved) std::cerr << "deltadeck: bench train: " << e << "\n";
    return 2;
  }
  trainer::SessionOptions so;
  so.run_dir = tmp + "/bench";
  so.measure_only = true;
  if (a.profile) {
    so.profile_from_step = a.warmup + a.steps;
    so.profile_steps = kProfileSteps;
    so.profile_trace = a.profile_trace;
    so.profile_top = a.profile_top;
  }
  std::string profile_report;
  trainer::Session session(cfg, so);
  session.start();
  std::map<std::string, std::vector<double>> after_warmup;  // metric -> values of timed steps
  std::string device;
  int64_t params = 0, tokens_per_step = 0, last_tokens = 0;
  trainer::EndedEvent ended;
  std::string cuda_graph = "off";  // the CPU, or a step that was never captured
  std::string graph_overflow;      // the trainer's note of the first step too large for the graph
  while (auto ev = session.events().pop()) {
    if (auto* m = std::get_if<trainer::MetricsEvent>(&*ev)) {
      if (m->step <= a.warmup || m->step > a.warmup + a.steps) {
        last_tokens = m->tokens;
        continue;
      }
      for (const auto& [k, v] : m->values) after_warmup[k].push_back(v);
      if (m->step == a.warmup + 1) tokens_per_step = m->tokens - last_tokens;
    } else if (auto* s = std::get_if<trainer::StartedEvent>(&*ev)) {
      device = s->device;
      params = s->params;
    } else if (auto* l = std::get_if<trainer::LogEvent>(&*ev)) {
      if (l->level == "error") std::cerr << "error: " << l->text << "\n";
      if (l->level == "profile") profile_report = l->text;
      // Whether the timed steps replayed a captured CUDA graph (trainer/step_graph.h), and if not why.
      if (l->text.rfind("CUDA graph step off: ", 0) == 0) cuda_graph = "off: " + l->text.substr(21);
      if (l->text.find("CUDA graph: step") == 0 && l->text.find(" captured;") != std::string::npos) cuda_graph = "on";
      if (l->text.rfind("CUDA graph capture failed", 0) == 0) cuda_graph = "off: " + l->text;
      // A packed batch with more document pieces than the captured step has room for runs eagerly
      // (logged once, at the first such step): the median may then mix replayed and eager steps.
      if (l->text.rfind("CUDA graph: step", 0) == 0 && l->text.find("run eagerly") != std::string::npos)
        graph_overflow = l->text.substr(std::string("CUDA graph: ").size());
    } else if (auto* e = std::get_if<trainer::EndedEvent>(&*ev)) {
      ended = *e;
    }
  }
  session.join();
  storage::files::remove_tree(tmp);
  if (ended.status == trainer::RunStatus::Failed) {
    std::cerr << "deltadeck: bench train: the run failed: " << ended.message << "\n";
    return 1;
  }
  const double step_ms = median(after_warmup["step_time_ms"]);
  const double tok_s = step_ms > 0 ? static_cast<double>(tokens_per_step) / (step_ms / 1e3) : 0;
  const double mfu = median(after_warmup["mfu"]);
  double peak = 0;
  for (double v : after_warmup["mem_peak_gib"]) peak = std::max(peak, v);

  nlohmann::json j;
  j["preset"] = a.preset;
  j["family"] = a.family;
  j["precision"] = a.precision;
  j["gdr_scan"] = a.gdr_scan;
  j["fp8_ffn"] = a.fp8_ffn;
  j["row_kernels"] = a.row_kernels;
  j["sdpa"] = a.sdpa;
  j["rope_qkv"] = a.rope_qkv;
  j["mla_qkv"] = a.mla_qkv;
  j["mla_values"] = a.mla_values;
  j["mla_first_products"] = a.mla_first_products;
  j["split_gradients"] = a.split_gradients;
  j["packed_attention"] = a.packed_attention;
  j["weight_grads"] = a.weight_grads;
  j["adamw"] = a.adamw;
  j["muon_kernels"] = a.muon_kernels;
  j["weight_grad_stream"] = a.weight_grad_stream;
  j["graph_gemms"] = a.graph_gemms;
  j["state_products"] = a.state_products;
  j["solve_overlap"] = a.solve_overlap;
  j["chunk_copies"] = a.chunk_copies;
  j["chunk_decay"] = a.chunk_decay;
  j["weight_shadows"] = a.weight_shadows;
  j["expert_weights"] = a.expert_weights;
  j["moe_inputs"] = a.moe_inputs;
  j["moe_weights"] = a.moe_weights;
  j["gdn_l2norm"] = a.gdn_l2norm;
  j["gdn_gates"] = a.gdn_gates;
  j["gdn_output_wgrad"] = a.gdn_output_wgrad;
  j["grad_norm"] = a.grad_norm;
  j["expert_grads"] = a.expert_grads;
  j["expert_grad_pieces"] = a.expert_grad_pieces;
  j["devices"] = a.devices;
  j["device"] = device;
  j["params"] = params;
  j["tokens_per_step"] = tokens_per_step;
  j["steps_timed"] = after_warmup["step_time_ms"].size();
  j["median_step_ms"] = step_ms;
  j["tokens_per_s"] = tok_s;
  j["mfu"] = mfu;
  j["peak_mem_gib"] = peak;
  // Time the step waited for its batch (median): above zero, the loader, not the GPU, set the pace.
  j["data_wait_ms"] = median(after_warmup["data_wait_ms"]);
  j["cuda_graph"] = cuda_graph;
  if (!graph_overflow.empty()) j["cuda_graph_overflow"] = graph_overflow;
  std::printf("| model | precision | devices | tokens/step | median step | tokens/s | MFU | peak mem |\n"
              "|---|---|---|---|---|---|---|---|\n"
              "| %s/%s | %s | %s | %lld | %.1f ms | %.0f | %.1f%% | %.2f GiB |\n",
              a.family.c_str(), a.preset.c_str(), a.precision.c_str(), a.devices.c_str(),
              static_cast<long long>(tokens_per_step), step_ms, tok_s, 100 * mfu, peak);
  std::printf("on %s; CUDA graph step: %s%s\ndata wait: %.2f ms a step (median)\n%s\n", device.c_str(),
              cuda_graph.c_str(), graph_overflow.empty() ? "" : ("; " + graph_overflow).c_str(),
              median(after_warmup["data_wait_ms"]), j.dump().c_str());
  if (a.profile) std::printf("\n%s", profile_report.empty() ? "(no profile was recorded)\n" : profile_report.c_str());
  if (!a.json_path.empty()) {
    std::ofstream f(a.json_path);
    f << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace app
