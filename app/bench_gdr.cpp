// `deltadeck bench gdr`: the chunked gated delta rule alone (model/gdr.h) at a given shape, the
// forward and the forward+backward, with the delta rule's CUDA kernels (chunk kernels and scan) and
// with their ATen twins, so the kernels' effect is measured in one process. Inputs are made like the layer makes
// them (L2-normalised q and k, β in (0,1), log-decay ≤ 0) in the chosen dtype; the core computes in
// fp32 as in training. Times are medians over --repeats runs after two warm-ups, two ways: each run
// alone, synchronised before and after (the host's own time per call counts), and on a GPU also
// queued back to back, each run timed by CUDA events while the host stays ahead, as in a training
// step (the host's time is hidden behind the GPU's).
// The default rows call the rule as the Gated DeltaNet layer does in training (o_as_rows, no final
// state): on the 16-bit path the output comes back as bf16 chunk rows, which its output norm reads
// in place, and its gradient goes back so. One row ("fp32 tokens") takes the output in token order
// and in the core's fp32 instead, as a caller outside the layer gets it.
#include <torch/cuda.h>
#include <torch/torch.h>

#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>

#include "app/bench_command.h"
#include "model/bmm_fp32.h"
#include "model/gdr.h"
#include "model/gdr_chunk_core.h"
#include "kernels/gdr_head_sizes.h"
#include "kernels/gdr_scan.h"
#include "model/gdr_scan.h"
#include "model/gdr_state_grads.h"
#include "trainer/step_profile.h"

namespace app {

namespace {

void sync(const torch::Device& dev) {
  if (dev.is_cuda()) torch::cuda::synchronize(dev.index());
}

template <typename F>
double median_ms(const torch::Device& dev, int repeats, F&& fn) {
  std::vector<double> ms;
  for (int r = -2; r < repeats; ++r) {
    sync(dev);
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    sync(dev);
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r >= 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The median of `repeats` runs queued without waiting (after two warm-ups), each timed between CUDA
// events on the current stream; 0 on the CPU.
template <typename F>
double median_queued_ms(const torch::Device& dev, int repeats, F&& fn) {
#if defined(DD_HAVE_CUDA)
  if (!dev.is_cuda()) return 0.0;
  for (int r = 0; r < 2; ++r) fn();
  sync(dev);
  std::vector<at::cuda::CUDAEvent> ev;
  for (int r = 0; r <= repeats; ++r) ev.emplace_back(cudaEventDefault);
  const auto stream = c10::cuda::getCurrentCUDAStream(dev.index());
  ev[0].record(stream);
  for (int r = 0; r < repeats; ++r) {
    fn();
    ev[r + 1].record(stream);
  }
  sync(dev);
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) ms.push_back(ev[r].elapsed_time(ev[r + 1]));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
#else
  (void)dev;
  (void)repeats;
  (void)fn;
  return 0.0;
#endif
}

}  // namespace

int bench_gdr(const BenchGdrArgs& a) {
  if (a.batch < 1 || a.seq < 1 || a.heads < 1 || a.head_dim < 1 || a.chunk < 1 || a.repeats < 1) {
    std::cerr << "deltadeck: bench gdr: --batch, --seq, --heads, --head-dim, --chunk and --repeats must be >= 1\n";
    return 2;
  }
  if (a.value_dim < 0) {
    std::cerr << "deltadeck: bench gdr: --value-dim must be >= 1 (or 0 for --head-dim's value)\n";
    return 2;
  }
  if (a.chunk_decay != "fast" && a.chunk_decay != "exact") {
    std::cerr << "deltadeck: bench gdr: --chunk-decay: expected fast or exact, got \"" << a.chunk_decay << "\"\n";
    return 2;
  }
#if defined(DD_HAVE_CUDA)
  kernels::gdr_chunk_fast_decay(a.chunk_decay == "fast");
#endif
  torch::ScalarType dt;
  if (a.dtype == "bf16") {
    dt = torch::kBFloat16;
  } else if (a.dtype == "fp32") {
    dt = torch::kFloat32;
  } else {
    std::cerr << "deltadeck: bench gdr: --dtype: expected bf16 or fp32, got \"" << a.dtype << "\"\n";
    return 2;
  }
  const torch::Device dev = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::manual_seed(0);
  const int64_t B = a.batch, T = a.seq, H = a.heads, D = a.head_dim, Dv = a.value_dim > 0 ? a.value_dim : D;
  auto opt = torch::TensorOptions().device(dev).dtype(torch::kFloat32);
  auto unit = [](const torch::Tensor& x) { return x / x.norm(2, -1, true); };
  auto q = unit(torch::randn({B, T, H, D}, opt)).to(dt), k = unit(torch::randn({B, T, H, D}, opt)).to(dt);
  auto v = torch::randn({B, T, H, Dv}, opt).to(dt);
  auto beta = torch::rand({B, T, H}, opt).to(dt);
  auto g = torch::nn::functional::logsigmoid(torch::randn({B, T, H}, opt) + 4.0).to(dt);  // mostly near 0, ≤ 0
  // The output's gradient as the op takes it: in its output's shape (token order, or the chunk
  // rows) and dtype (bf16 rows on the 16-bit path, else the core's fp32), drawn outside the timed
  // runs, not cast in them: a caller's next layer hands back a gradient of O's own dtype. (Until
  // issue 7, stop 37, fwd+bwd timed a bf16 -> fp32 cast of it; docs/perf.md.)
  torch::Tensor grad_o;  // drawn at the first (untimed) run, again when a mode's output differs
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));

  // The scan's products as training takes them for inputs of this dtype (model.gdn_scan_precision
  // "auto": plain TF32 for bf16, split TF32 for fp32); one row runs the other kind.
  const bool tf32_default = model::gdr_scan_uses_tf32("auto", dt);
  std::printf("gated delta rule, chunked: B=%lld T=%lld H=%lld dk=%lld dv=%lld C=%lld, inputs %s, %s, scan products %s\n",
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
              static_cast<long long>(D), static_cast<long long>(Dv), static_cast<long long>(a.chunk), a.dtype.c_str(),
              dev.is_cuda() ? "GPU" : "CPU", tf32_default ? "TF32" : "split TF32");
  if (dev.is_cuda()) {
    std::printf("%-22s %12s %16s %8s %16s %16s %8s\n", "chunk core", "forward ms", "fwd+bwd ms", "ratio",
                "queued: fwd ms", "queued: f+b ms", "ratio");
  } else {
    std::printf("%-22s %12s %16s %8s\n", "chunk core", "forward ms", "fwd+bwd ms", "ratio");
  }
  // The kernels run on a GPU only; on the CPU every row would be the ATen twins. Each row calls the
  // rule as the layer would with that row's setting: the output comes as bf16 rows only where the
  // front is bf16 (the 16-bit path), so the rows that turn that path off (fp32 front or states,
  // split-TF32 scan, unfused, a scan variant the bf16 scan does not take) also take an fp32 output
  // and gradient, and the backward kernels that read them. The second row takes the output in token
  // order and fp32 (the call outside the layer); then the scan's products of the other kind, the
  // states and the front in fp32, ...; the same kernels without the fused ones (the forward's front
  // and the backward through the solve as the separate launches they replace), with the batched
  // products against the states in 64-column block tiles; then the tensor-core scan in blocks of each
  // fixed width of state columns (the first row's picks one by kernels::gdr_scan_mma_width), the
  // state scan in fp32 FMA instead of on tensor cores, the scan's products of the other kind, and
  // (where the products are TF32) the states and corrected values kept in fp32 instead of bf16, and
  // the fused front's outputs kept in fp32 instead of bf16, dO's products into the reverse scan's
  // inputs run before it instead of inside it, the backward recomputing the front's Kd, Qg, P
  // and decay instead of reading the forward's, and the products with the states after the reverse
  // scan as four batched GEMMs and a row dot instead of one kernel, v's gradient taken from dRu
  // in the tail instead of in the solve's backward, the backward's dQg, dKd, dW and dRw in fp32
  // instead of bf16, and the reverse scan's products in bf16 instead of TF32.
  struct Mode {
    const char* name;
    bool kernels = true;
    bool fused = true;
    int scan_variant = kernels::kGdrScanAuto;  // kernels::GdrScanVariant
    bool wide_products = true;  // the batched products in block tiles as wide as N takes
    bool other_scan_products = false;  // the scan's products not as tf32_default says
    bool fp32_states = false;          // h_in and v_new kept in fp32 under TF32 products (model::gdr_bf16_states)
    bool fp32_front = false;           // the fused front's outputs kept in fp32 (model::gdr_bf16_front)
    bool split_solve = false;          // the solve's backward with split, not TF32, products (model::gdr_tf32_chunk_products)
    bool products_then_scan = false;   // dO's products into the reverse scan's inputs run before it (model::gdr_scan_fuse_output_grads)
    bool recompute_front = false;      // the backward recomputes the front's Kd, Qg, P, decay (model::gdr_save_front)
    bool state_grads_apart = false;    // the products with the states as four GEMMs and a row dot (model::gdr_fuse_state_grads)
    bool dv_in_tail = false;           // v's gradient from dRu in the tail, not in the solve's backward (model::gdr_dv_in_solve)
    bool fp32_chunk_grads = false;     // dQg, dKd, dW, dRw in fp32, not bf16 (model::gdr_bf16_chunk_grads)
    bool tf32_reverse_scan = false;    // the reverse scan's products in TF32, not bf16 (model::gdr_bf16_scan_products)
    bool tf32_forward_scan = false;    // the forward scan's products in TF32, not bf16 (model::gdr_bf16_forward_scan_products)
    bool tf32_state_grads = false;     // the products with the states in TF32, not bf16 (model::gdr_bf16_state_grads_products)
    bool tf32_bf16_gemms = false;      // products of two bf16 operands as TF32 mma, not bf16 (model::bmm_fp32_bf16_mma)
    bool split_tail = false;           // the tail's dq, dk products split-TF32, not bf16 (model::gdr_bf16_tail_products)
    bool fp32_solve_tiles = false;     // the solve's backward on fp32 tiles, TF32 mma (model::gdr_bf16_solve_tiles)
    bool token_output = false;         // the output in token order and fp32, not the layer's rows (o_as_rows)
    bool thread_copies = false;        // the bf16 scans' threads all copying, not two copy warps
  };
  // The default kernels with one setting changed.
  auto default_but = [](const char* name, auto Mode::*field, auto value) {
    Mode m{name};
    m.*field = value;
    return m;
  };
  const char* other_products = tf32_default ? "kernels, split-TF32 scan" : "kernels, TF32 scan";
  const std::vector<Mode> modes =
      dev.is_cuda() ? std::vector<Mode>{Mode{"kernels (default)"},
                                        default_but("kernels, thread copies", &Mode::thread_copies, true),
                                        default_but("kernels, fp32 tokens", &Mode::token_output, true),
                                        default_but(other_products, &Mode::other_scan_products, true),
                                        default_but("kernels, fp32 states", &Mode::fp32_states, true),
                                        default_but("kernels, fp32 front", &Mode::fp32_front, true),
                                        default_but("kernels, split solve", &Mode::split_solve, true),
                                        default_but("kernels, products+scan", &Mode::products_then_scan, true),
                                        default_but("kernels, front again", &Mode::recompute_front, true),
                                        default_but("kernels, state GEMMs", &Mode::state_grads_apart, true),
                                        default_but("kernels, dv in tail", &Mode::dv_in_tail, true),
                                        default_but("kernels, fp32 grads", &Mode::fp32_chunk_grads, true),
                                        default_but("kernels, TF32 rev scan", &Mode::tf32_reverse_scan, true),
                                        default_but("kernels, TF32 fwd scan", &Mode::tf32_forward_scan, true),
                                        default_but("kernels, TF32 st prods", &Mode::tf32_state_grads, true),
                                        default_but("kernels, TF32 bf16 mm", &Mode::tf32_bf16_gemms, true),
                                        default_but("kernels, split tail", &Mode::split_tail, true),
                                        default_but("kernels, fp32 solve", &Mode::fp32_solve_tiles, true),
                                        default_but("kernels, unfused", &Mode::fused, false),
                                        default_but("kernels, 64-col GEMMs", &Mode::wide_products, false),
                                        default_but("kernels, 32-col scan", &Mode::scan_variant,
                                                    int{kernels::kGdrScanTensorCores32}),
                                        default_but("kernels, 64-col scan", &Mode::scan_variant,
                                                    int{kernels::kGdrScanTensorCores64}),
                                        default_but("kernels, 96-col scan", &Mode::scan_variant,
                                                    int{kernels::kGdrScanTensorCores96}),
                                        default_but("kernels, 128-col scan", &Mode::scan_variant,
                                                    int{kernels::kGdrScanTensorCores128}),
                                        default_but("kernels, FMA scan", &Mode::scan_variant,
                                                    int{kernels::kGdrScanSimt16}),
                                        Mode{"ATen pieces", false, false}}
                    : std::vector<Mode>{Mode{"ATen pieces", false, false}};
  for (const Mode& mode : modes) {
    if (a.default_only && &mode != &modes.front()) break;
    model::gdr_use_kernels(mode.kernels);
#if defined(DD_HAVE_CUDA)
    kernels::gdr_scan_copy_warps(!mode.thread_copies);  // kernels/gdr_scan_copy_warps.cu
#endif
    model::gdr_use_fused_kernels(mode.fused);
    model::gdr_scan_variant(mode.scan_variant);
    model::bmm_fp32_wide_tiles(mode.wide_products);
    model::gdr_bf16_states(!mode.fp32_states);
    model::gdr_bf16_front(!mode.fp32_front);
    model::gdr_tf32_chunk_products(!mode.split_solve);
    model::gdr_scan_fuse_output_grads(!mode.products_then_scan);
    model::gdr_save_front(!mode.recompute_front);
    model::gdr_fuse_state_grads(!mode.state_grads_apart);
    model::gdr_dv_in_solve(!mode.dv_in_tail);
    model::gdr_bf16_chunk_grads(!mode.fp32_chunk_grads);
    model::gdr_bf16_scan_products(!mode.tf32_reverse_scan);
    model::gdr_bf16_forward_scan_products(!mode.tf32_forward_scan);
    model::gdr_bf16_state_grads_products(!mode.tf32_state_grads);
    model::bmm_fp32_bf16_mma(!mode.tf32_bf16_gemms);
    model::gdr_bf16_tail_products(!mode.split_tail);
    model::gdr_bf16_solve_tiles(!mode.fp32_solve_tiles);
    const bool tf32_scan = mode.other_scan_products ? !tf32_default : tf32_default;
    const bool rows = !mode.token_output;
    auto forward = [&] {
      torch::NoGradGuard no_grad;
      model::gdr_forward_chunked(q, k, v, beta, g, scale, {}, {}, a.chunk, tf32_scan, rows, nullptr,
                                 /*final_state=*/!rows);
    };
    const double fwd = median_ms(dev, a.repeats, forward);
    auto fwd_bwd = [&] {
      auto qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true);
      auto vv = v.detach().requires_grad_(true), bb = beta.detach().requires_grad_(true);
      auto gg = g.detach().requires_grad_(true);
      auto out = model::gdr_forward_chunked(qq, kk, vv, bb, gg, scale, {}, {}, a.chunk, tf32_scan, rows, nullptr,
                                            /*final_state=*/!rows);
      const torch::Tensor& o = rows ? out.o_rows : out.o;
      if (!grad_o.defined() || grad_o.sizes() != o.sizes() || grad_o.scalar_type() != o.scalar_type()) {
        grad_o = torch::randn(o.sizes(), opt).to(o.scalar_type());
      }
      o.backward(grad_o);
    };
    const double both = median_ms(dev, a.repeats, fwd_bwd);
    if (dev.is_cuda()) {
      const double fwd_q = median_queued_ms(dev, a.repeats, forward), both_q = median_queued_ms(dev, a.repeats, fwd_bwd);
      std::printf("%-22s %12.3f %16.3f %7.2fx %16.3f %16.3f %7.2fx\n", mode.name, fwd, both, both / fwd, fwd_q, both_q,
                  both_q / fwd_q);
    } else {
      std::printf("%-22s %12.3f %16.3f %7.2fx\n", mode.name, fwd, both, both / fwd);
    }
    std::fflush(stdout);
    if (a.profile && &mode == &modes.front() && dev.is_cuda()) {  // the default row's kernels
      for (const bool backward : {false, true}) {
        constexpr int kRuns = 3;
        auto prof = trainer::StepProfile::start(dev.index());
        for (int r = 0; r < kRuns; ++r) backward ? fwd_bwd() : forward();
        sync(dev);
        std::printf("\nprofile, %s (%s), per run:\n%s", backward ? "forward+backward" : "forward", mode.name,
                    prof->stop("", kRuns, backward ? both : fwd).c_str());
      }
    }
  }
  model::gdr_scan_variant(kernels::kGdrScanAuto);
  model::gdr_bf16_states(true);
  model::gdr_bf16_front(true);
  model::gdr_tf32_chunk_products(true);
  model::gdr_scan_fuse_output_grads(true);
  model::gdr_save_front(true);
  model::gdr_fuse_state_grads(true);
  model::gdr_dv_in_solve(true);
  model::gdr_bf16_chunk_grads(true);
  model::gdr_bf16_scan_products(true);
  model::gdr_bf16_forward_scan_products(true);
  model::gdr_bf16_state_grads_products(true);
  model::gdr_bf16_tail_products(true);
  model::gdr_bf16_solve_tiles(true);
  model::bmm_fp32_wide_tiles(true);
  model::bmm_fp32_bf16_mma(true);
  model::gdr_use_fused_kernels(true);
  model::gdr_use_kernels(true);
  return 0;
}

}  // namespace app
