// Muon: momentum SGD whose update for a 2-D hidden weight matrix is orthogonalised by a few
// Newton–Schulz iterations (the update's singular values pushed towards 1), scaled by
// sqrt(max(1, rows/cols)). A 3-D parameter is a stack of matrices (the MoE experts' [E, rows, cols]
// weights), each expert's matrix orthogonalised by itself: one batched iteration. Embeddings, the
// head, norms and other non-matrix parameters are left to AdamW by the caller, which decides the
// split (trainer/param_groups.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainer {

// The quintic Newton–Schulz iteration on G (2-D, or 3-D: each matrix of the stack by itself),
// normalised by its Frobenius norm first: X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ and (a, b, c) =
// (3.4445, −4.7750, 2.0315), `steps` times, on the wide orientation (a tall G as Gᵀ, transposed
// back). Runs in G's dtype (fp32 or bf16). Any thread.
at::Tensor newton_schulz_orthogonalize(const at::Tensor& G, int64_t steps = 5);

struct MuonOptions {
  double momentum = 0.95;
  bool nesterov = true;
  int64_t ns_steps = 5;
  double weight_decay = 0.0;  // decoupled, multiplied by lr
  // The iteration's dtype (train.muon_precision): fp32, or bf16 (tensor-core products on a GPU,
  // where fp32 ones made Muon's update take longer than the rest of the step: docs/perf.md, stop 71).
  // Momentum and weights stay in their own dtype.
  at::ScalarType ns_dtype = at::kFloat;
};

class Muon {
 public:
  // params: 2-D matrices and 3-D stacks of them only (throws std::invalid_argument naming one that is
  // neither).
  Muon(std::vector<std::pair<std::string, at::Tensor>> params, MuonOptions opt);
  // m ← μ·m + g; u = NS(nesterov ? g + μ·m : m)·sqrt(max(1, rows/cols)); w ← w·(1 − lr·wd) − lr·u
  // (rows and cols: a matrix's, the last two sizes of a stack). The matrices of one size (device
  // and dtype) go through one batched iteration. Each direction is written into its group's stack
  // in the iteration's dtype, and each update read from the iteration's result: on a GPU the momenta
  // and directions of every matrix are one pass, and the decay, update and shadow another
  // (kernels/muon_update.h); elsewhere ATen's ops do the same.
  // The same as begin_step(lr) then update().
  void step(double lr);
  // The two halves of step(), for a step captured as a CUDA graph (trainer/step_graph.h):
  // begin_step writes lr into a scalar on the parameters' device, every step outside the graph;
  // update() is the device work, which reads the lr from there and so can be recorded once and
  // replayed. With write_shadows, update() also writes each updated weight's bf16 shadow
  // (model/weight_shadow.h) where it has one: a replay bumps no version, so the forward would not
  // see that the weights changed. Eagerly ATen's update bumps the versions and the next forward
  // recasts instead; on a GPU the update's kernel (kernels/muon_update.h) bumps none and writes
  // every shadow itself, asked or not.
  void begin_step(double lr);
  void update(bool write_shadows = false);
  // Process-wide: whether CUDA steps take kernels/muon_update.h's two passes for the momenta and the
  // update (the default) or ATen's ops, the reference (`bench train --muon-kernels aten`, to measure
  // the change). Set before training starts.
  static void use_own_kernels(bool on);
  // How many updates (process-wide) took both kernels: for tests that must know they ran.
  static int64_t kernel_updates_taken();
  // "muon_momentum.<name>" for checkpoints, and back.
  std::vector<std::pair<std::string, at::Tensor>> state_tensors() const;
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<at::Tensor> momentum_;
  struct GroupStep;  // one group's matrices with a gradient this step, and their stack
  void momentum_and_directions(std::vector<GroupStep>& groups);
  bool momentum_and_directions_by_kernel(std::vector<GroupStep>& groups);  // false: not taken
  void apply(const std::vector<GroupStep>& groups, bool write_shadows);
  bool apply_by_kernel(const std::vector<GroupStep>& groups);  // false: not taken; writes every shadow

  std::vector<std::vector<size_t>> same_size_;  // indexes of params_, by (rows, cols, device, dtype)
  at::Tensor lr_device_;  // fp32 scalar on the parameters' device: the lr update() applies
  MuonOptions opt_;
};

}  // namespace trainer
