// Gradients a backward may widen in place. A gradient that sits inside a wider buffer (columns of
// rows as wide as a fused projection's output, the other columns unused) can have the rest of
// those rows filled in where it is, instead of being copied into a new buffer of that width, when
// nothing else holds the buffer: the Gated DeltaNet's conv gradient in the output gate's rows
// (model/fused_short_conv.cpp), the split product's gradient rows (model/mixed_linear.cpp), MLA's
// V gradient in kv's rows (model/fused_rope.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>

namespace model {

// Whether t's storage is held by t alone and holds `span` elements from `before` elements ahead of
// t's first one (so t.storage_offset() ≥ before): the buffer the caller would fill around t. The
// caller checks t's own sizes and strides. Undefined t: false.
inline bool sole_storage_with_room(const at::Tensor& t, int64_t before, int64_t span) {
  if (!t.defined() || t.storage_offset() < before) return false;
  const auto& st = t.storage();
  return st.use_count() == 1 &&
         st.nbytes() >= static_cast<size_t>((t.storage_offset() - before + span) * t.element_size());
}

}  // namespace model
