// The kernel's backward is the same scan run in reverse on the gradients (kernels/gdr_scan.h);
// the three per-chunk weight gradients are then batched matmuls over the saved states:
//   dU = dy,  dW = −dy · h_inᵀ,  dKd = v_new · dh_nextᵀ,  ddecay = Σ h_in ⊙ dh_next
// where dh_next is the gradient of the state each chunk ends in (the reverse scan's out_state).
#include "model/gdr_scan.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "kernels/gdr_scan.h"  // the scan variants (the kernel itself only with CUDA)
#include "model/bmm_fp32.h"

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "model/layers.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {
std::atomic<bool> g_use_kernel{true};
std::atomic<int> g_variant{kernels::kGdrScanAuto};
std::atomic<int64_t> g_split_launches{0}, g_tf32_launches{0};  // gdr_scan_launch_counts
std::atomic<bool> g_bf16_states{true};
std::atomic<bool> g_fuse_output_grads{true};
std::atomic<int64_t> g_fused_backward_launches{0}, g_bf16_product_launches{0}, g_bf16_output_grad_launches{0};
std::atomic<bool> g_bf16_forward_products{true};
std::atomic<int64_t> g_bf16_forward_launches{0};
std::atomic<bool> g_output_in_scan{true};
std::atomic<int64_t> g_output_in_scan_launches{0};
}  // namespace

void gdr_output_in_scan(bool on) { g_output_in_scan = on; }
int64_t gdr_scan_output_launches() { return g_output_in_scan_launches.load(); }

void gdr_bf16_forward_scan_products(bool on) { g_bf16_forward_products = on; }
int64_t gdr_scan_bf16_forward_launches() { return g_bf16_forward_launches.load(); }

void gdr_scan_use_kernel(bool on) { g_use_kernel = on; }
void gdr_bf16_states(bool on) { g_bf16_states = on; }
bool gdr_bf16_states() { return g_bf16_states; }
void gdr_scan_variant(int variant) { g_variant = variant; }

int64_t gdr_scan_busy_docs(const GdrScanPlan& plan) {
  int64_t chunks = 0;
  for (const int64_t cnt : plan.step_count) chunks += cnt;
  const auto steps = static_cast<int64_t>(plan.step_count.size());
  return steps > 0 ? (chunks + steps - 1) / steps : 0;
}

void gdr_scan_fuse_output_grads(bool on) { g_fuse_output_grads = on; }
int64_t gdr_scan_fused_backward_launches() { return g_fused_backward_launches.load(); }
int64_t gdr_scan_bf16_product_launches() { return g_bf16_product_launches.load(); }
int64_t gdr_scan_bf16_output_grad_launches() { return g_bf16_output_grad_launches.load(); }

GdrScanLaunchCounts gdr_scan_launch_counts() { return {g_split_launches.load(), g_tf32_launches.load()}; }

GdrScanResult gdr_scan_reference(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& Kd,
                                 const torch::Tensor& decay, const torch::Tensor& h0, const GdrScanPlan& plan) {
  const int64_t H = plan.heads;
  // Each scan step's rows of the chunk list, as one split: its backward concatenates the steps'
  // gradients once. Narrowing the whole list per step instead makes autograd zero-fill and add a
  // full-size gradient for every step (thousands of kernels per layer at T = 2048).
  std::vector<int64_t> step_rows;
  for (const int64_t cnt : plan.step_count) step_rows.push_back(cnt * H);
  const auto W_m = W.split_with_sizes(step_rows, 0), U_m = U.split_with_sizes(step_rows, 0);
  const auto Kd_m = Kd.split_with_sizes(step_rows, 0);
  const auto decay_m = decay.view({-1, 1, 1}).split_with_sizes(step_rows, 0);

  torch::Tensor h = h0;  // [n_running·H, dk, dv] in sorted document order
  std::vector<torch::Tensor> h_in, v_new, finished;
  const size_t n_steps = plan.step_count.size();
  // Documents without chunks (a fixed layout's empty ones, last in sorted order) end as they start.
  const int64_t first_rows = n_steps > 0 ? plan.step_count[0] * H : 0;
  if (h.size(0) > first_rows) {
    auto parts = h.split_with_sizes({first_rows, h.size(0) - first_rows}, 0);
    finished.push_back(parts[1]);
    h = parts[0];
  }
  for (size_t m = 0; m < n_steps; ++m) {
    const int64_t cnt = plan.step_count[m] * H;
    h_in.push_back(h);
    // Vn = U − W h: values corrected against the chunk-entry state.
    auto vn = torch::baddbmm(U_m[m], W_m[m], h, 1.0, -1.0);
    v_new.push_back(vn);
    h = torch::baddbmm(decay_m[m] * h, Kd_m[m].transpose(1, 2), vn);
    const int64_t next = (m + 1 < n_steps ? plan.step_count[m + 1] : 0) * H;
    if (next < cnt) {  // documents that have run out of chunks leave the prefix
      auto parts = h.split_with_sizes({next, cnt - next}, 0);
      finished.push_back(parts[1]);
      h = parts[0];
    }
  }
  // Finished states came off the end of the sorted order first.
  std::reverse(finished.begin(), finished.end());
  GdrScanResult out;
  out.h_in = n_steps == 1 ? h_in[0] : torch::cat(h_in, 0);
  out.v_new = n_steps == 1 ? v_new[0] : torch::cat(v_new, 0);
  out.h_final = finished.size() == 1 ? finished[0] : torch::cat(finished, 0);
  return out;
}

GdrScanGrads gdr_scan_backward_reference(const torch::Tensor& W, const torch::Tensor& Kd, const torch::Tensor& decay,
                                         const torch::Tensor& d_hin, const torch::Tensor& d_vnew,
                                         const torch::Tensor& d_hfinal, const GdrScanPlan& plan) {
  const int64_t H = plan.heads, dk = W.size(2), dv = d_vnew.size(2);
  std::vector<int64_t> step_rows;
  for (const int64_t cnt : plan.step_count) step_rows.push_back(cnt * H);
  const auto W_m = W.split_with_sizes(step_rows, 0), Kd_m = Kd.split_with_sizes(step_rows, 0);
  const auto decay_m = decay.view({-1, 1, 1}).split_with_sizes(step_rows, 0);
  const auto dvn_m = d_vnew.split_with_sizes(step_rows, 0);
  std::vector<torch::Tensor> dhin_m;
  if (d_hin.defined()) dhin_m = d_hin.split_with_sizes(step_rows, 0);

  // Walking backwards, documents join the running prefix at their last chunk, starting from their
  // final state's gradient (rows [s·H, (s+1)·H) of d_hfinal, sorted order).
  const size_t n_steps = plan.step_count.size();
  std::vector<torch::Tensor> dh_next(n_steps), dU(n_steps);
  torch::Tensor dh = torch::zeros({0, dk, dv}, W.options());
  for (size_t m = n_steps; m-- > 0;) {
    const int64_t rows = plan.step_count[m] * H;
    if (dh.size(0) < rows) {
      const int64_t have = dh.size(0);
      auto joining = d_hfinal.defined() ? d_hfinal.narrow(0, have, rows - have)
                                        : torch::zeros({rows - have, dk, dv}, W.options());
      dh = torch::cat({dh, joining}, 0);
    }
    dh_next[m] = dh;
    auto du = torch::baddbmm(dvn_m[m], Kd_m[m], dh);
    dU[m] = du;
    dh = torch::baddbmm(decay_m[m] * dh, W_m[m].transpose(1, 2), du, 1.0, -1.0);
    if (d_hin.defined()) dh = dh + dhin_m[m];
  }
  // Documents without chunks pass their final state's gradient straight to their initial state.
  const int64_t all_rows = plan.n_docs * H;
  if (dh.size(0) < all_rows) {
    const int64_t have = dh.size(0);
    auto idle = d_hfinal.defined() ? d_hfinal.narrow(0, have, all_rows - have)
                                   : torch::zeros({all_rows - have, dk, dv}, W.options());
    dh = torch::cat({dh, idle}, 0);
  }
  GdrScanGrads out;
  out.dh_next = n_steps == 1 ? dh_next[0] : torch::cat(dh_next, 0);
  out.dU = n_steps == 1 ? dU[0] : torch::cat(dU, 0);
  out.dh0 = dh;
  return out;
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The plan as the kernel reads it: step offsets and per-document chunk counts, int32 on the device.
struct DevicePlan {
  torch::Tensor step_off, n_chunks;
};

DevicePlan device_plan(const GdrScanPlan& p, const torch::Device& dev) {
  if (p.device_step_off.defined()) return {p.device_step_off, p.device_doc_chunks};
  std::vector<int32_t> off(p.step_off.begin(), p.step_off.end()), nch(static_cast<size_t>(p.n_docs), 0);
  for (const int64_t cnt : p.step_count) {
    for (int64_t s = 0; s < cnt; ++s) ++nch[static_cast<size_t>(s)];
  }
  return {cached_device_ints(off, dev), cached_device_ints(nch, dev)};
}

const float* ptr_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
bool is_bf16(const torch::Tensor& t) { return t.scalar_type() == torch::kBFloat16; }
const uint16_t* bf16_bits(const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }

// The kernel's arguments for a plan's sizes and product mode (no pointers yet).
kernels::GdrScanArgs sized_args(const GdrScanPlan& plan, int64_t C, int64_t dk, int64_t dv) {
  kernels::GdrScanArgs a;
  a.variant = g_variant;
  a.tf32x3 = !plan.tf32_products;
  a.n_docs = plan.n_docs;
  a.busy_docs = gdr_scan_busy_docs(plan);
  a.H = plan.heads;
  a.C = C;
  a.dk = dk;
  a.dv = dv;
  return a;
}

// One launch of the scan (either direction). Returns {out_state, out_y, final}; out_state and out_y
// in bf16 when bf16_outputs is asked for and the kernel takes it (kernels::gdr_scan_takes_bf16_outputs).
// bf16_products: the forward's bf16 form takes its products as bf16 mma where the kernel has that
// form for the sizes (kernels::gdr_scan_forward_bf16_width), TF32 ones otherwise.
// P and Q may be bf16 (both), in the forward with a bf16 A and bf16 outputs, in the backward with
// an fp32 A and E (kernels::GdrScanArgs::P_bf16); the callers check the kernel takes them.
// With `output` (the forward's bf16 form only): also the chunk output O = scale (oP v_new + oQg h_in)
// where the kernel takes it (kernels::gdr_scan_forward_output_width), as a fourth tensor (bf16
// [R, C, dv]; undefined where it does not).
struct ScanOutput {
  torch::Tensor P, Qg;  // bf16 [R, C, C] and [R, C, dk]
  double scale = 1;
};
std::vector<torch::Tensor> run_scan(const torch::Tensor& A, const torch::Tensor& P, const torch::Tensor& Q,
                                    const torch::Tensor& decay, const torch::Tensor& E, const torch::Tensor& init,
                                    const DevicePlan& dp, int64_t n_docs, int64_t busy, int64_t H, float sign_p,
                                    float sign_q, bool reverse, bool tf32_products, bool bf16_outputs = false,
                                    bool bf16_products = false, const ScanOutput* output = nullptr) {
  const int64_t R = A.size(0), C = A.size(1), dv = A.size(2), dk = P.size(2);
  kernels::GdrScanArgs a;
  if (is_bf16(P)) {
    a.P_bf16 = bf16_bits(P);
    a.Q_bf16 = bf16_bits(Q);
  } else {
    a.P = P.data_ptr<float>();
    a.Q = Q.data_ptr<float>();
  }
  if (is_bf16(A)) a.A_bf16 = bf16_bits(A);
  else a.A = A.data_ptr<float>();
  a.decay = decay.data_ptr<float>();
  a.E = ptr_or_null(E);
  a.init = ptr_or_null(init);
  a.step_off = dp.step_off.data_ptr<int32_t>();
  a.n_chunks = dp.n_chunks.data_ptr<int32_t>();
  a.sign_p = sign_p;
  a.sign_q = sign_q;
  a.reverse = reverse;
  a.variant = g_variant;
  a.tf32x3 = !tf32_products;
  a.n_docs = n_docs;
  a.busy_docs = busy;
  a.H = H;
  a.C = C;
  a.dk = dk;
  a.dv = dv;
  const bool bf16 = bf16_outputs && kernels::gdr_scan_takes_bf16_outputs(a);
  const auto out_opt = A.options().dtype(bf16 ? torch::kBFloat16 : torch::kFloat32);
  auto out_state = torch::empty({R, dk, dv}, out_opt);
  auto out_y = torch::empty({R, C, dv}, out_opt);
  auto fin = torch::empty({n_docs * H, dk, dv}, A.options().dtype(torch::kFloat32));
  if (bf16) {
    a.out_state_bf16 = reinterpret_cast<uint16_t*>(out_state.data_ptr());
    a.out_y_bf16 = reinterpret_cast<uint16_t*>(out_y.data_ptr());
  } else {
    a.out_state = out_state.data_ptr<float>();
    a.out_y = out_y.data_ptr<float>();
  }
  a.final_state = fin.data_ptr<float>();
  a.bf16_products =
      bf16_products && kernels::gdr_scan_forward_bf16_form_ok(a) && kernels::gdr_scan_forward_bf16_width(a) > 0;
  torch::Tensor O;
  if (output != nullptr && kernels::gdr_scan_forward_output_width(a) > 0) {
    O = torch::empty({R, C, dv}, A.options().dtype(torch::kBFloat16));
    a.o_P_bf16 = bf16_bits(output->P);
    a.o_Qg_bf16 = bf16_bits(output->Qg);
    a.out_o_bf16 = reinterpret_cast<uint16_t*>(O.data_ptr());
    a.out_scale = static_cast<float>(output->scale);
  }
  check_kernel_launch(kernels::gdr_scan(a, c10::cuda::getCurrentCUDAStream(A.device().index()).stream()),
                      "gated delta rule scan");
  if (a.bf16_products) ++g_bf16_forward_launches;
  if (O.defined()) ++g_output_in_scan_launches;
  ++(tf32_products ? g_tf32_launches : g_split_launches);
  return {out_state, out_y, fin, O};
}

torch::Tensor contiguous_or_undefined(const torch::Tensor& t) { return t.defined() ? t.contiguous() : t; }

// The reverse scan's E (the gradient reaching h_in): undefined means zero, which the kernel's
// fp32 form reads as no E; its bf16-input form always reads one, so it gets zeros.
torch::Tensor backward_e(const torch::Tensor& d_hin, const torch::Tensor& W, int64_t dv) {
  if (d_hin.defined()) return d_hin.contiguous();
  if (!is_bf16(W)) return d_hin;
  return torch::zeros({W.size(0), W.size(2), dv}, W.options().dtype(torch::kFloat32));
}

class GdrScanFn : public torch::autograd::Function<GdrScanFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& W, const torch::Tensor& U,
                               const torch::Tensor& Kd, const torch::Tensor& decay, const torch::Tensor& h0,
                               const GdrScanPlan& plan) {
    ctx->set_materialize_grads(false);  // unused outputs' gradients stay undefined (no zero tensors)
    auto dp = device_plan(plan, W.device());
    auto Wc = W.contiguous(), Uc = U.contiguous(), Kc = Kd.contiguous(), dc = decay.contiguous();
    auto outs = run_scan(Uc, Wc, Kc, dc, {}, h0.contiguous(), dp, plan.n_docs, gdr_scan_busy_docs(plan), plan.heads,
                         -1.f, 1.f, false, plan.tf32_products, plan.tf32_products && plan.bf16_states,
                         g_bf16_forward_products);
    ctx->save_for_backward({Wc, Kc, dc, outs[0], outs[1]});
    ctx->saved_data["step_off"] = dp.step_off;
    ctx->saved_data["n_chunks"] = dp.n_chunks;
    ctx->saved_data["n_docs"] = plan.n_docs;
    ctx->saved_data["busy_docs"] = gdr_scan_busy_docs(plan);
    ctx->saved_data["heads"] = plan.heads;
    ctx->saved_data["tf32_products"] = plan.tf32_products;
    outs.resize(3);  // h_in, v_new, h_final (no chunk output asked for)
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &W = saved[0], &Kd = saved[1], &decay = saved[2];
    const auto h_in = saved[3].to(torch::kFloat32), v_new = saved[4].to(torch::kFloat32);  // bf16 under bf16_states
    DevicePlan dp{ctx->saved_data["step_off"].toTensor(), ctx->saved_data["n_chunks"].toTensor()};
    const int64_t n_docs = ctx->saved_data["n_docs"].toInt(), H = ctx->saved_data["heads"].toInt();
    auto d_vnew = grads[1].defined() ? grads[1].contiguous() : torch::zeros_like(v_new);
    auto outs = run_scan(d_vnew, Kd, W, decay, backward_e(grads[0], W, v_new.size(2)), contiguous_or_undefined(grads[2]),
                         dp, n_docs, ctx->saved_data["busy_docs"].toInt(), H, 1.f, -1.f, true,
                         ctx->saved_data["tf32_products"].toBool());
    const auto &dh_next = outs[0], &dU = outs[1], &dh0 = outs[2];
    auto dW = -torch::bmm(dU, h_in.transpose(1, 2));
    auto dKd = torch::bmm(v_new, dh_next.transpose(1, 2));
    auto ddecay = (h_in * dh_next).sum({1, 2});
    return {dW, dU, dKd, ddecay, dh0, torch::Tensor()};
  }
};

// Whether the kernel takes these inputs: fp32 throughout, or W and Kd in bf16 where the kernel
// takes bf16 inputs for the plan (TF32 products on the tensor-core kernel), with A (U in the
// forward) bf16 in the forward and fp32 (the values' gradient) in the backward.
bool kernel_takes(const torch::Tensor& W, const torch::Tensor& A, const torch::Tensor& Kd, const torch::Tensor& decay,
                  const torch::Tensor& h0, const GdrScanPlan& plan, bool forward) {
  if (!g_use_kernel || !W.is_cuda() || W.size(0) == 0 || decay.scalar_type() != torch::kFloat32 ||
      (h0.defined() && h0.scalar_type() != torch::kFloat32) || !kernels::gdr_scan_supports(W.size(1), W.size(2))) {
    return false;
  }
  const auto f32 = torch::kFloat32;
  if (W.scalar_type() == f32 && Kd.scalar_type() == f32) return A.scalar_type() == f32;
  if (!is_bf16(W) || !is_bf16(Kd) || is_bf16(A) != forward || (!forward && A.scalar_type() != f32)) return false;
  if (forward && !(plan.tf32_products && plan.bf16_states)) return false;  // bf16 inputs write bf16 outputs
  return kernels::gdr_scan_takes_bf16_inputs(sized_args(plan, W.size(1), W.size(2), A.size(2)));
}

// The fused reverse scan (kernels::GdrScanArgs::dO); the caller checked
// gdr_scan_backward_takes_output_grad.
GdrScanGrads run_fused_backward(const torch::Tensor& W, const torch::Tensor& Kd, const torch::Tensor& decay,
                                const torch::Tensor& Pm, const torch::Tensor& Qg, const torch::Tensor& dO,
                                const torch::Tensor& dO_rows, double scale, const torch::Tensor& d_hfinal,
                                const GdrScanPlan& plan, bool bf16_dU, bool bf16_products) {
  const int64_t R = W.size(0), C = W.size(1), dk = W.size(2), dv = dO.size(1);
  const auto dp = device_plan(plan, W.device());
  const auto Wc = W.contiguous(), Kc = Kd.contiguous(), Pc = Pm.contiguous(), Qgc = Qg.contiguous();
  const auto dc = decay.contiguous(), init = contiguous_or_undefined(d_hfinal);
  const auto rows_map = dO_rows.defined() ? dO_rows.contiguous() : dO_rows;
  kernels::GdrScanArgs a = sized_args(plan, C, dk, dv);
  a.P_bf16 = bf16_bits(Kc);  // the backward's P is Kd and its Q is W (kernels/gdr_scan.h)
  a.Q_bf16 = bf16_bits(Wc);
  a.Pm_bf16 = bf16_bits(Pc);
  a.Qg_bf16 = bf16_bits(Qgc);
  a.bf16_products = bf16_products && kernels::gdr_scan_fused_bf16_width(a) > 0;  // sizes only
  // A bf16 dO goes in as it is where the bf16 products take it, else widened (exactly).
  torch::Tensor dO_widened;
  if (is_bf16(dO) && a.bf16_products && bf16_dU && dv % 8 == 0) {
    a.dO_bf16 = bf16_bits(dO);
    ++g_bf16_output_grad_launches;
  } else {
    dO_widened = dO.to(torch::kFloat32);
    a.dO = dO_widened.data_ptr<float>();
  }
  a.dO_rows = rows_map.defined() ? rows_map.data_ptr<int32_t>() : nullptr;
  a.out_scale = static_cast<float>(scale);
  a.decay = dc.data_ptr<float>();
  a.init = ptr_or_null(init);
  a.step_off = dp.step_off.data_ptr<int32_t>();
  a.n_chunks = dp.n_chunks.data_ptr<int32_t>();
  a.sign_p = 1.f;
  a.sign_q = -1.f;
  a.reverse = true;
  const auto f32 = W.options().dtype(torch::kFloat32);
  const auto bf16 = W.options().dtype(torch::kBFloat16);
  GdrScanGrads out{torch::empty({R, dk, dv}, bf16), torch::empty({R, C, dv}, bf16_dU ? bf16 : f32),
                   torch::empty({plan.n_docs * plan.heads, dk, dv}, f32)};
  a.out_state_bf16 = reinterpret_cast<uint16_t*>(out.dh_next.data_ptr());
  if (bf16_dU) {
    a.out_y_bf16 = reinterpret_cast<uint16_t*>(out.dU.data_ptr());
  } else {
    a.out_y = out.dU.data_ptr<float>();
  }
  a.final_state = out.dh0.data_ptr<float>();
  check_kernel_launch(kernels::gdr_scan(a, c10::cuda::getCurrentCUDAStream(W.device().index()).stream()),
                      "gated delta rule scan (fused backward)");
  ++g_tf32_launches;
  ++g_fused_backward_launches;
  if (a.bf16_products) ++g_bf16_product_launches;
  return out;
}

}  // namespace
#endif

namespace {
// W, U, Kd widened to fp32, for the paths that take fp32 only.
torch::Tensor f32(const torch::Tensor& x) { return x.to(torch::kFloat32); }

// The ATen loop's steps are sized on the host: a captured graph would replay the capture's batch
// plan for every later batch. A fixed layout's plan is captured only through the kernel.
void check_loop_not_captured(const GdrScanPlan& plan) {
  TORCH_CHECK(!(plan.device_step_off.defined() && plan.device_step_off.is_cuda() && cuda_stream_capturing()),
              "gdr scan: this step's delta rule runs the scan's ATen loop (sizes the kernel does not take, or "
              "the kernel switched off), whose steps are planned on the host and cannot be captured in a CUDA graph");
}
}  // namespace

bool gdr_scan_takes_bf16_inputs(const GdrScanPlan& plan, int64_t C, int64_t dk, int64_t dv) {
#if defined(DD_HAVE_CUDA)
  return g_use_kernel && plan.tf32_products && plan.n_docs > 0 && plan.heads > 0 &&
         kernels::gdr_scan_takes_bf16_inputs(sized_args(plan, C, dk, dv));
#else
  (void)plan, (void)C, (void)dk, (void)dv;
  return false;
#endif
}

GdrScanResult gdr_scan(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& Kd,
                       const torch::Tensor& decay, const torch::Tensor& h0, const GdrScanPlan& plan) {
  if (!h0.defined()) {  // zero states, as a tensor for the paths below
    const auto state_opt = U.options().dtype(decay.scalar_type());
    return gdr_scan(W, U, Kd, decay, torch::zeros({plan.n_docs * plan.heads, W.size(2), U.size(2)}, state_opt), plan);
  }
#if defined(DD_HAVE_CUDA)
  if (kernel_takes(W, U, Kd, decay, h0, plan, true)) {
    auto outs = GdrScanFn::apply(W, U, Kd, decay, h0, plan);
    return {outs[0], outs[1], outs[2]};
  }
#endif
  if (W.scalar_type() == torch::kBFloat16) return gdr_scan(f32(W), f32(U), f32(Kd), decay, h0, plan);
  check_loop_not_captured(plan);
  return gdr_scan_reference(W, U, Kd, decay, h0, plan);
}

GdrScanResult gdr_scan_with_output(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& Kd,
                                   const torch::Tensor& decay, const torch::Tensor& h0, const GdrScanPlan& plan,
                                   const torch::Tensor& P, const torch::Tensor& Qg, double scale, torch::Tensor& O) {
  O = torch::Tensor();
#if defined(DD_HAVE_CUDA)
  if (g_output_in_scan && g_bf16_forward_products && is_bf16(P) && is_bf16(Qg) && P.is_contiguous() &&
      Qg.is_contiguous() && kernel_takes(W, U, Kd, decay, h0, plan, true)) {
    const auto dp = device_plan(plan, W.device());
    const ScanOutput output{P, Qg, scale};
    // run_scan launches the scan either way (its results are gdr_scan's: the same arguments), with
    // the output where the kernel takes it.
    auto outs = run_scan(U.contiguous(), W.contiguous(), Kd.contiguous(), decay.contiguous(), {},
                         h0.defined() ? h0.contiguous() : h0, dp, plan.n_docs, gdr_scan_busy_docs(plan), plan.heads,
                         -1.f, 1.f, false, plan.tf32_products, plan.tf32_products && plan.bf16_states, true, &output);
    O = outs[3];
    return {outs[0], outs[1], outs[2]};
  }
#else
  (void)P, (void)Qg, (void)scale;
#endif
  return gdr_scan(W, U, Kd, decay, h0, plan);
}

bool gdr_scan_backward_takes_output_grad(const torch::Tensor& W, const torch::Tensor& Kd, const torch::Tensor& Pm,
                                         const torch::Tensor& Qg, const torch::Tensor& dO, const GdrScanPlan& plan) {
#if defined(DD_HAVE_CUDA)
  if (!g_fuse_output_grads || !g_use_kernel || !plan.tf32_products || plan.n_docs < 1 || plan.heads < 1 ||
      !W.is_cuda() || W.size(0) == 0 || !is_bf16(W) || !is_bf16(Kd) || !is_bf16(Pm) || !is_bf16(Qg) ||
      (dO.scalar_type() != torch::kFloat32 && !is_bf16(dO)) || dO.dim() != 2 || !dO.is_contiguous()) {
    return false;
  }
  return kernels::gdr_scan_fused_width(sized_args(plan, W.size(1), W.size(2), dO.size(1))) > 0;
#else
  (void)W, (void)Kd, (void)Pm, (void)Qg, (void)dO, (void)plan;
  return false;
#endif
}

GdrScanGrads gdr_scan_backward_from_output_grad(const torch::Tensor& W, const torch::Tensor& Kd,
                                                const torch::Tensor& decay, const torch::Tensor& Pm,
                                                const torch::Tensor& Qg, const torch::Tensor& dO,
                                                const torch::Tensor& dO_rows, double scale,
                                                const torch::Tensor& d_hfinal, const GdrScanPlan& plan,
                                                bool bf16_dU, bool bf16_products) {
  TORCH_CHECK(W.dim() == 3 && Kd.sizes() == W.sizes() && Qg.sizes() == W.sizes() && dO.dim() == 2,
              "gdr scan backward: expected W, Kd and Qg of one shape [R, C, dk] and dO [rows, dv], got ", W.sizes(),
              ", ", Kd.sizes(), ", ", Qg.sizes(), " and ", dO.sizes());
  const int64_t R = W.size(0), C = W.size(1);
  TORCH_CHECK(Pm.dim() == 3 && Pm.size(0) == R && Pm.size(1) == C && Pm.size(2) == C,
              "gdr scan backward: expected Pm [R, C, C] = [", R, ", ", C, ", ", C, "], got ", Pm.sizes());
  TORCH_CHECK(dO_rows.defined() ? dO_rows.numel() == R * C : dO.size(0) == R * C,
              "gdr scan backward: dO's rows must be R·C = ", R * C, " chunk rows, or a row map of R·C entries; got ",
              dO.size(0), " rows", dO_rows.defined() ? " and a map of " + std::to_string(dO_rows.numel()) : "");
#if defined(DD_HAVE_CUDA)
  // The kernel reads raw pointers: a device int32 map, fp32 decay and final gradient, and the
  // 16-byte alignment its staged copies need (dO's and the bf16 inputs' rows are, by their sizes).
  const auto aligned = [](const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  const bool map_ok =
      !dO_rows.defined() || (dO_rows.scalar_type() == torch::kInt32 && dO_rows.device() == W.device());
  const bool raw_ok = map_ok && decay.scalar_type() == torch::kFloat32 &&
                      (!d_hfinal.defined() || d_hfinal.scalar_type() == torch::kFloat32);
  if (raw_ok && gdr_scan_backward_takes_output_grad(W, Kd, Pm, Qg, dO, plan) && aligned(dO) && aligned(W) &&
      aligned(Kd) && aligned(Pm) && aligned(Qg)) {
    return run_fused_backward(W, Kd, decay, Pm, Qg, dO, dO_rows, scale, d_hfinal, plan, bf16_dU, bf16_products);
  }
#endif
  torch::Tensor d_vnew, d_hin;
  const auto dO_f = dO.scalar_type() == torch::kBFloat16 ? dO.to(torch::kFloat32) : dO;  // widened exactly
  if (dO_rows.defined()) {
    const GatheredRows dOr{dO_f, dO_rows, R, C};
    d_vnew = bmm_fp32(Pm.transpose(1, 2), dOr, scale);
    d_hin = bmm_fp32(Qg.transpose(1, 2), dOr, scale);
  } else {
    const auto dOr = dO_f.view({R, C, dO_f.size(1)});
    d_vnew = bmm_fp32(Pm.transpose(1, 2), dOr, scale);
    d_hin = bmm_fp32(Qg.transpose(1, 2), dOr, scale);
  }
  return gdr_scan_backward(W, Kd, decay, d_hin, d_vnew, d_hfinal, plan);
}

GdrScanGrads gdr_scan_backward(const torch::Tensor& W, const torch::Tensor& Kd, const torch::Tensor& decay,
                               const torch::Tensor& d_hin, const torch::Tensor& d_vnew, const torch::Tensor& d_hfinal,
                               const GdrScanPlan& plan) {
#if defined(DD_HAVE_CUDA)
  if (kernel_takes(W, d_vnew, Kd, decay, d_hfinal, plan, false)) {
    auto dp = device_plan(plan, W.device());
    auto outs = run_scan(d_vnew.contiguous(), Kd.contiguous(), W.contiguous(), decay.contiguous(),
                         backward_e(d_hin, W, d_vnew.size(2)), contiguous_or_undefined(d_hfinal), dp, plan.n_docs,
                         gdr_scan_busy_docs(plan), plan.heads, 1.f, -1.f, true, plan.tf32_products);
    return {outs[0], outs[1], outs[2]};
  }
#endif
  if (W.scalar_type() == torch::kBFloat16) return gdr_scan_backward(f32(W), f32(Kd), decay, d_hin, d_vnew, d_hfinal, plan);
  check_loop_not_captured(plan);
  return gdr_scan_backward_reference(W, Kd, decay, d_hin, d_vnew, d_hfinal, plan);
}

}  // namespace model
