// bf16/fp16 copies of fp32 weights that the optimizer keeps current ("shadows"). A linear product
// in a WeightGradInPlaceScope (model/mixed_linear.h) multiplies with its weights cast to bf16: a
// cast kernel per product per forward that reads 4 and writes 2 bytes a parameter (GPT-124M: 48
// launches, 0.28 ms a step). With a shadow the cast is written once into a buffer that lives with
// the weights, and our AdamW kernel (kernels/adamw.h) writes the rounded updated weight into it as
// it updates the fp32 one: 2 bytes a parameter, no launch of its own.
//
// A shadow is used only while it is known to hold the weights' current values: each weight's
// version counter and data pointer must be what they were when the shadow was last written in
// full. Anything that changes a weight through ATen (a checkpoint load, Muon, ATen's AdamW, an
// in-place op) bumps the version; EMA's swap (set_data) changes the data pointer; either makes the
// next use cast again. Our AdamW kernel writes weights through raw pointers, which bumps nothing:
// that is why it must write the shadow of every weight that has one (trainer::AdamW asks
// weight_shadow_of for each; a weight belongs to one group at most), and why any other raw writer
// (a `.data()` view, NCCL, a replayed graph's ATen update) must call invalidate_weight_shadows, or
// write the shadows itself inside the graph (Muon's update, trainer/muon.h).
// A CUDA graph's replay runs none of these host checks: the trainer calls refresh_weight_shadows
// before each replay, which recasts any shadow gone stale in between, and invalidates them all
// before a step that runs eagerly once a graph exists.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace model {

// [W1; W2; ...] [Σ out_i, in] in `dtype` (bf16 or fp16), the same values as
// cast_weight_blocks(weights, dtype): the group's shadow when it is current, else the shadow
// recast (one kernel on a GPU) and then current. The first call for a group allocates its shadow.
// Falls back to cast_weight_blocks (nothing kept) when shadows are off, while a CUDA graph is being
// captured and the group has no shadow yet, for a weight already shadowed in another group, or for
// weights that are not 2-D contiguous fp32 of one device and width.
// With padded_rows above Σ out_i, a group's first call allocates its shadow with zero rows past the
// weights' up to padded_rows (never written again: the optimizer and the recasts write the weights'
// rows only), and every call for it returns all padded_rows rows: a product at an aligned width
// (model/mixed_linear.cpp) reads them as they are, where a padded copy of the weights cost a pass
// over them a forward. A group allocated narrower, or no shadow, returns Σ out_i rows; the caller
// pads those itself.
at::Tensor shadowed_weight_blocks(at::TensorList weights, at::ScalarType dtype, int64_t padded_rows = 0);

// The same for stacked experts' weights, each [E, out_i, in] (MoE gate and up): [E, Σ out_i, in],
// the same values as cast_weight_blocks(weights, dtype), under the same rules (3-D contiguous fp32
// weights of one device, E and in).
at::Tensor shadowed_expert_blocks(at::TensorList weights, at::ScalarType dtype);

// The shadow of one weight (a contiguous [out, in] row block of its group's shadow; for experts,
// the [E, out, in] block, contiguous within each expert), or an undefined tensor when it has none. An optimizer that updates the weight through raw pointers
// writes the updated weight's rounded values here in the same pass.
at::Tensor weight_shadow_of(const at::Tensor& weight);

// Recasts every shadow whose weights changed (version or data pointer) since it was written, on
// the current stream. Before a CUDA graph replay, whose forward reads the shadows unchecked.
void refresh_weight_shadows();

// Marks every shadow stale (the next use or refresh recasts it): for code that writes weights
// through raw pointers without writing their shadows.
void invalidate_weight_shadows();

// Process-wide switch, on by default: off, shadowed_weight_blocks is cast_weight_blocks and
// weight_shadow_of finds nothing (`bench train --weight-shadows off`, to measure the change).
void weight_shadows(bool on);

// Drops the shadows of the groups these weights belong to (a finished run's parameters: the
// buffers are otherwise kept until the weights are gone and a new group prunes them). No CUDA
// graph that reads them may be replayed afterwards.
void release_weight_shadows(const std::vector<at::Tensor>& weights);

// Drops every shadow and its buffer (tests).
void clear_weight_shadows();

// How many groups have a shadow now, and how many recasts (forward or refresh) have run since the
// process started: for tests that check a shadow is reused, not recast.
int64_t weight_shadow_groups();
int64_t weight_shadow_casts();

}  // namespace model
