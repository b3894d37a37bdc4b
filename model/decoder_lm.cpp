// DecoderLM: embedding, L blocks, final norm, (tied) LM head, optional softcap, and the
// cross-entropy in fp32. Init follows MODEL.md §7: N(0, σ₀) everywhere, N(0, σ₀/√(2L)) on the
// residual-output projections, norm weights 1, the GDN gates per §4.
#include "model/decoder_lm.h"

#include <torch/torch.h>

#include "model/fused_embedding.h"
#include "model/linear_cross_entropy.h"

#include <cmath>
#include <stdexcept>

namespace model {

DecoderLMImpl::DecoderLMImpl(const ModelConfig& c) : cfg_(c) {
  auto problems = validate(c);
  if (!problems.empty()) {
    std::string msg = "invalid model config:";
    for (auto& p : problems) msg += "\n  " + p;
    throw std::invalid_argument(msg);
  }
  emb = register_module("emb", torch::nn::Embedding(c.vocab_size, c.d));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t l = 0; l < c.n_layers; ++l) blocks->push_back(Block(c, l));
  norm_f = register_module("norm_f", RMSNorm(c.d, c.norm_affine));
  if (!c.tie_embeddings) lm_head = register_parameter("lm_head", torch::empty({c.vocab_size, c.d}));
  init_weights();
}

void DecoderLMImpl::init_weights() {
  torch::NoGradGuard no_grad;
  const double std0 = cfg_.init_std;
  const double std_out = std0 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layers));
  emb->weight.normal_(0.0, std0);
  if (lm_head.defined()) lm_head.normal_(0.0, std0);
  for (auto& m : *blocks) m->as<BlockImpl>()->reset_parameters(std0, std_out);
  if (norm_f->weight.defined()) norm_f->weight.fill_(1.0);
}

torch::Tensor DecoderLMImpl::head(const torch::Tensor& h) {
  const auto& w = lm_head.defined() ? lm_head : emb->weight;
  // Logits and the loss run in fp32 (MODEL.md §0); the matmul runs in the activations' dtype.
  const auto head_dtype = h.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto wt = w.scalar_type() == h.scalar_type() ? w : w.to(h.scalar_type());
  auto z = torch::matmul(h, wt.t());
  if (z.scalar_type() != head_dtype) z = z.to(head_dtype);
  if (cfg_.logit_softcap > 0) z = cfg_.logit_softcap * torch::tanh(z / cfg_.logit_softcap);
  return z;
}

LMOutput DecoderLMImpl::forward_with_aux(const torch::Tensor& tokens, const Positions& p) {
  auto out = hidden(tokens, p);
  return {head(out.normed), out.aux};
}

DecoderLMImpl::Hidden DecoderLMImpl::hidden(const torch::Tensor& tokens, const Positions& p) {
  TORCH_CHECK(tokens.dim() == 2, "model: expected tokens [B,T], got ", tokens.sizes());
  // In a WeightGradInPlaceScope the lookup's gradient is added into the weight's .grad in place.
  auto x = embedding_in_place_applies(emb->weight, tokens) ? embedding_in_place(emb->weight, tokens) : emb(tokens);
  if (cfg_.embed_norm) x = rms_norm_plain(x);
  torch::Tensor aux, branch;
  for (auto& m : *blocks) {
    auto r = m->as<BlockImpl>()->forward(x, branch, p);
    x = r.x;
    branch = r.branch;
    if (r.aux_loss.defined()) aux = aux.defined() ? aux + r.aux_loss : r.aux_loss;
  }
  if (!aux.defined()) aux = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(tokens.device()));
  // The last block's FFN output is added inside the final norm.
  return {norm_f->add_forward(x, branch, /*for_matmul=*/true).y, aux};
}

torch::Tensor DecoderLMImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2, "model: expected tokens [B,T], got ", tokens.sizes());
  return forward_with_aux(tokens, dense_positions(tokens.size(0), tokens.size(1), tokens.device())).logits;
}

torch::Tensor DecoderLMImpl::forward_packed(const torch::Tensor& tokens, const torch::Tensor& cu_seqlens) {
  TORCH_CHECK(tokens.dim() == 2, "model: packed tokens must be [B,T], got ", tokens.sizes());
  return forward_with_aux(tokens, packed_positions(cu_seqlens, tokens.size(0), tokens.size(1), tokens.device())).logits;
}

LossParts DecoderLMImpl::loss_parts(const torch::Tensor& tokens, const torch::Tensor& targets,
                                    const torch::Tensor& cu_seqlens) {
  TORCH_CHECK(tokens.dim() == 2, "model: expected tokens [B,T], got ", tokens.sizes());
  auto p = cu_seqlens.defined() ? packed_positions(cu_seqlens, tokens.size(0), tokens.size(1), tokens.device())
                                : dense_positions(tokens.size(0), tokens.size(1), tokens.device());
  return loss_parts_at(tokens, targets, p);
}

LossParts DecoderLMImpl::loss_parts_at(const torch::Tensor& tokens, const torch::Tensor& targets, const Positions& p) {
  TORCH_CHECK(tokens.dim() == 2, "model: expected tokens [B,T], got ", tokens.sizes());
  auto out = hidden(tokens, p);
  if (cfg_.loss_chunk_tokens < 0) {
    auto logits = head(out.normed);
    auto ce = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                                                   torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
    return {ce + out.aux.to(ce.scalar_type()), ce, out.aux};
  }
  // The head and the loss together, in chunks of tokens: the batch's logits never exist at once.
  const auto& h = out.normed;
  const auto& w = lm_head.defined() ? lm_head : emb->weight;
  LinearCrossEntropyOptions o;
  o.softcap = cfg_.logit_softcap;
  o.chunk_rows = cfg_.loss_chunk_tokens;
  auto ce = linear_cross_entropy(h.reshape({-1, h.size(-1)}), w, targets.reshape({-1}), o);
  return {ce + out.aux.to(ce.scalar_type()), ce, out.aux};
}

torch::Tensor DecoderLMImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  return loss_parts(tokens, targets).total;
}

DecodeState DecoderLMImpl::new_decode_state() const {
  DecodeState s;
  s.layers.resize(static_cast<size_t>(cfg_.n_layers));
  return s;
}

torch::Tensor DecoderLMImpl::step(const torch::Tensor& tokens, DecodeState& state) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(1) == 1, "model step: expected tokens [B,1], got ", tokens.sizes());
  TORCH_CHECK(state.layers.size() == blocks->size(), "model step: decode state has ", state.layers.size(),
              " layers, the model ", blocks->size());
  auto x = emb(tokens);
  if (cfg_.embed_norm) x = rms_norm_plain(x);
  for (size_t l = 0; l < blocks->size(); ++l) x = blocks[l]->as<BlockImpl>()->step(x, state.layers[l]);
  return head(norm_f(x));
}

}  // namespace model
