// The fixed inputs of a CUDA-graph step (trainer/graph_inputs.h), on the CPU: a packed batch's
// positions land in the fixed tensors with cu_seqlens padded by empty documents, the same loss comes
// out at the padded positions as at the batch's own, a batch with more pieces than the room is
// refused, and one of another shape throws naming both shapes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "model/decoder_lm.h"
#include "trainer/graph_inputs.h"

namespace {

trainer::data::Batch packed_batch(int64_t B, int64_t T, std::vector<int32_t> cu, int64_t vocab) {
  trainer::data::Batch b;
  b.inputs = torch::randint(vocab, {B, T}, torch::kInt64);
  b.labels = torch::randint(vocab, {B, T}, torch::kInt64);
  b.cu_seqlens = torch::tensor(cu, torch::kInt32);
  b.pieces = static_cast<int64_t>(cu.size()) - 1;
  return b;
}

}  // namespace

TEST(GraphInputs, PackedBatchPositionsArePaddedWithEmptyDocuments) {
  const int64_t B = 2, T = 8;
  trainer::GraphInputs in(B, T, /*packed=*/true, /*max_pieces=*/6, torch::kCPU);
  auto b = packed_batch(B, T, {0, 5, 8, 11, 16}, 50);
  ASSERT_TRUE(in.take(b));
  EXPECT_TRUE(torch::equal(in.tokens(), b.inputs));
  EXPECT_TRUE(torch::equal(in.labels(), b.labels));
  const auto& p = in.positions();
  EXPECT_TRUE(p.varlen());
  EXPECT_EQ(p.max_seqlen, T);
  EXPECT_TRUE(torch::equal(p.cu_seqlens_device, torch::tensor({0, 5, 8, 11, 16, 16, 16}, torch::kInt32)));
  EXPECT_TRUE(torch::equal(p.pos, torch::tensor({0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4}, torch::kInt64).view({B, T})));
  EXPECT_TRUE(torch::equal(p.doc_ids, torch::tensor({0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3}, torch::kInt64)));

  // Seven pieces do not fit a room of six: refused, the tokens still copied.
  auto many = packed_batch(B, T, {0, 1, 2, 3, 8, 10, 12, 16}, 50);
  EXPECT_FALSE(in.take(many));
  EXPECT_TRUE(torch::equal(in.tokens(), many.inputs));
}

TEST(GraphInputs, PaddedPositionsGiveTheBatchsOwnLoss) {
  torch::manual_seed(3);
  model::ModelConfig c;
  c.vocab_size = 64;
  c.d = 32;
  c.n_layers = 2;
  c.attn_heads = 2;
  c.attn_kv_heads = 2;
  c.attn_head_dim = 16;
  c.ffn_hidden = 64;
  c.max_seq_len = 16;
  model::DecoderLM m(c);
  const int64_t B = 2, T = 16;
  trainer::GraphInputs in(B, T, true, /*max_pieces=*/8, torch::kCPU);
  auto b = packed_batch(B, T, {0, 3, 16, 20, 27, 32}, c.vocab_size);
  ASSERT_TRUE(in.take(b));
  const double own = m->loss_parts(b.inputs, b.labels, b.cu_seqlens).ce.item<double>();
  const double padded = m->loss_parts_at(in.tokens(), in.labels(), in.positions()).ce.item<double>();
  EXPECT_NEAR(padded, own, 1e-6 * std::abs(own));
  const double dense = m->loss_parts(b.inputs, b.labels).ce.item<double>();
  EXPECT_GT(std::abs(dense - own), 1e-4) << "documents made no difference: the comparison proves nothing";
}

TEST(GraphInputs, RoomFollowsTheFirstBatch) {
  EXPECT_EQ(trainer::graph_piece_room(16, 17), 32);   // two pieces per row at least
  EXPECT_EQ(trainer::graph_piece_room(8, 160), 240);  // short documents: 1.5 × what came first
  EXPECT_EQ(trainer::graph_piece_room(8, 21), 32);    // rounded up to a multiple of 8
}

TEST(GraphInputs, OtherShapeThrowsNamingBoth) {
  trainer::GraphInputs dense(2, 8, /*packed=*/false, 0, torch::kCPU);
  trainer::data::Batch b;
  b.inputs = torch::zeros({3, 8}, torch::kInt64);
  b.labels = torch::zeros({3, 8}, torch::kInt64);
  try {
    dense.take(b);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[3, 8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.cuda_graph"), std::string::npos) << msg;
  }
  b.inputs = torch::zeros({2, 8}, torch::kInt64);
  b.labels = torch::zeros({2, 8}, torch::kInt64);
  EXPECT_TRUE(dense.take(b));
  b.cu_seqlens = torch::tensor({0, 8, 16}, torch::kInt32);
  EXPECT_THROW(dense.take(b), std::runtime_error);  // boundaries the dense inputs cannot carry
}
