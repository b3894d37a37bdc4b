// DecoderLM: embedding, L pre-norm blocks, final norm, (tied) LM head, optional softcap, and the
// cross-entropy in fp32. Init follows MODEL.md §7: N(0, σ₀) everywhere, N(0, σ₀/√(2L)) on the
// residual-output projections, norm weights 1.
#include "model/gpt.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

namespace model {

namespace {
// Positions of a dense batch: every row is one document, pos(t) = t.
Positions dense_positions(const torch::Tensor& tokens) {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kInt64).device(tokens.device()));
  return {pos.unsqueeze(0).expand({B, T})};
}
}  // namespace

BlockImpl::BlockImpl(const ModelConfig& c, int64_t layer) {
  const char mixer = mixer_at(c, layer);
  if (mixer != 'S') {
    throw std::invalid_argument(std::string("model.pattern: mixer '") + mixer +
                                "' is not available in this build yet (only 'S')");
  }
  if (c.moe_experts > 0) {
    throw std::invalid_argument("model.moe_experts: MoE feed-forward is not available in this build yet");
  }
  norm1 = register_module("norm1", RMSNorm(c.d, c.norm_affine));
  attn = register_module("attn", Attention(c));
  norm2 = register_module("norm2", RMSNorm(c.d, c.norm_affine));
  ffn = register_module("ffn", SwiGLU(c.d, c.ffn_hidden));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const Positions& p) {
  auto h = x + attn(norm1(x), p);
  return h + ffn(norm2(h));
}

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
  for (auto& m : *blocks) {
    auto* b = m->as<BlockImpl>();
    for (auto* lin : {&b->attn->wq, &b->attn->wk, &b->attn->wv, &b->ffn->gate, &b->ffn->up})
      (*lin)->weight.normal_(0.0, std0);
    b->attn->wo->weight.normal_(0.0, std_out);
    b->ffn->down->weight.normal_(0.0, std_out);
    for (auto* n : {&b->norm1, &b->norm2})
      if ((*n)->weight.defined()) (*n)->weight.fill_(1.0);
  }
  if (norm_f->weight.defined()) norm_f->weight.fill_(1.0);
}

torch::Tensor DecoderLMImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2, "model: expected tokens [B,T], got ", tokens.sizes());
  auto p = dense_positions(tokens);
  auto x = emb(tokens);
  if (cfg_.embed_norm) x = rms_norm_plain(x);
  for (auto& m : *blocks) x = m->as<BlockImpl>()->forward(x, p);
  x = norm_f(x);
  const auto& w = lm_head.defined() ? lm_head : emb->weight;
  // Logits and the loss run in fp32 (MODEL.md §0).
  const auto head_dtype = x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto z = torch::matmul(x, w.to(x.scalar_type()).t()).to(head_dtype);
  if (cfg_.logit_softcap > 0) z = cfg_.logit_softcap * torch::tanh(z / cfg_.logit_softcap);
  return z;
}

torch::Tensor DecoderLMImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  auto z = forward(tokens);
  return torch::nn::functional::cross_entropy(
      z.reshape({-1, z.size(-1)}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
}

}  // namespace model
