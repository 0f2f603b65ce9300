// mpiddp::checkpoint against the same function run plainly: equal outputs and gradients (dropout
// included: the recompute draws the same mask and leaves the generator where the plain run does),
// nothing kept but its inputs, a tensor it reads but was not given caught in backward, nothing
// changed without gradient mode; the GPT's blocks checkpointed equal to the plain GPT; models that
// cannot be split refuse with one line.
#include <mpiddp/checkpoint.hpp>
#include <mpiddp/gpt.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/precision.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "error_of.hpp"

using mpiddp::testing::error_of;

namespace {

// Two Linears with dropout between: a block whose activations (the hidden layer, the mask) the
// checkpoint must not keep and must rebuild exactly.
struct TwoLayers {
  torch::nn::Linear a{8, 32}, b{32, 8};
  torch::nn::Dropout drop{0.5};
  torch::Tensor operator()(const torch::Tensor& x) { return b(drop(torch::gelu(a(x)))); }
  std::vector<torch::Tensor> parameters() {
    auto p = a->parameters();
    auto q = b->parameters();
    p.insert(p.end(), q.begin(), q.end());
    return p;
  }
};

struct Result {
  torch::Tensor out, input_grad, after;  // after: the next draw of the generator
  std::vector<torch::Tensor> grads;
};

Result run(bool checkpointed, bool dropout = true) {
  torch::manual_seed(3);
  TwoLayers f;
  if (!dropout) f.drop->eval();
  auto x = torch::randn({5, 8}, torch::requires_grad());
  torch::manual_seed(11);
  auto call = [&f](const torch::Tensor& t) { return f(t); };
  auto y = checkpointed ? mpiddp::checkpoint(call, x * 2, f.parameters()) : f(x * 2);
  (y.pow(2).sum()).backward();
  Result r{y.detach(), x.grad(), torch::rand({1}), {}};
  for (const auto& p : f.parameters()) r.grads.push_back(p.grad());
  return r;
}

mpiddp::GptConfig dropout_gpt() {
  mpiddp::GptConfig c;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 8;
  c.vocab_size = 29;
  c.dropout = 0.2;
  return c;
}

// The GPT's loss and its gradients after one backward, blocks checkpointed or not.
std::vector<torch::Tensor> gpt_gradients(bool checkpointed, c10::ScalarType precision) {
  torch::manual_seed(5);
  mpiddp::Gpt gpt(dropout_gpt());
  gpt->set_activation_checkpointing(checkpointed);
  auto tokens = torch::randint(0, 29, {4, 9}, torch::kLong);
  torch::manual_seed(6);
  torch::Tensor loss;
  {
    mpiddp::Autocast autocast(c10::kCPU, precision);
    auto logits = gpt->forward(tokens.narrow(1, 0, 8));
    loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 29}).to(torch::kFloat),
                                                tokens.narrow(1, 1, 8).reshape(-1));
  }
  loss.backward();
  std::vector<torch::Tensor> out{loss.detach()};
  for (const auto& p : gpt->parameters()) out.push_back(p.grad().clone());
  return out;
}

}  // namespace

TEST(Checkpoint, EqualsThePlainRunWithDropout) {
  const auto plain = run(false), checked = run(true);
  EXPECT_TRUE(torch::equal(plain.out, checked.out));
  EXPECT_TRUE(torch::equal(plain.input_grad, checked.input_grad));
  ASSERT_EQ(plain.grads.size(), checked.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_TRUE(torch::equal(plain.grads[i], checked.grads[i])) << i;
  // The recompute restored the generator after drawing: the draws after backward are the same.
  EXPECT_TRUE(torch::equal(plain.after, checked.after));
  // Dropout took effect (without it the outputs differ).
  EXPECT_FALSE(torch::equal(plain.out, run(false, false).out));
}

TEST(Checkpoint, KeepsOnlyItsInputsAndParameters) {
  TwoLayers f;
  auto x = torch::randn({5, 8}, torch::requires_grad());
  auto y = mpiddp::checkpoint([&f](const torch::Tensor& t) { return f(t); }, x, f.parameters());
  ASSERT_TRUE(y.grad_fn());
  // One node whose edges lead to the input and the 4 parameters, nothing of the block inside.
  EXPECT_EQ(y.grad_fn()->next_edges().size(), 1u + 4u);  // x, a.weight, a.bias, b.weight, b.bias
  size_t to_leaves = 0;
  for (const auto& e : y.grad_fn()->next_edges())
    to_leaves += e.function && e.function->name().find("AccumulateGrad") != std::string::npos;
  EXPECT_EQ(to_leaves, 5u);
}

TEST(Checkpoint, ATensorNotGivenIsCaughtInBackward) {
  TwoLayers f;
  auto x = torch::randn({5, 8}, torch::requires_grad());
  auto a_only = f.a->parameters();  // b's parameters left out
  auto y = mpiddp::checkpoint([&f](const torch::Tensor& t) { return f(t); }, x, a_only);
  const auto e = error_of([&] { y.sum().backward(); });
  EXPECT_NE(e.find("neither an input nor one of the parameters given"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(Checkpoint, WithoutGradientModeJustRuns) {
  TwoLayers f;
  torch::NoGradGuard no_grad;
  auto y = mpiddp::checkpoint([&f](const torch::Tensor& t) { return f(t); }, torch::randn({2, 8}), f.parameters());
  EXPECT_FALSE(y.grad_fn());
}

TEST(Checkpoint, GptBlocksCheckpointedEqualThePlainGpt) {
  for (auto precision : {c10::kFloat, c10::kBFloat16}) {
    const auto plain = gpt_gradients(false, precision), checked = gpt_gradients(true, precision);
    ASSERT_EQ(plain.size(), checked.size());
    double worst = 0;
    for (size_t i = 0; i < plain.size(); ++i)
      worst = std::max(worst, (plain[i] - checked[i]).abs().max().item<double>());
    EXPECT_LE(worst, 1e-6) << mpiddp::precision_name(precision);
  }
  // Evaluation is unchanged too (no gradient mode: the blocks run plainly).
  torch::manual_seed(5);
  mpiddp::Gpt gpt(dropout_gpt());
  gpt->eval();
  auto tokens = torch::randint(0, 29, {2, 8}, torch::kLong);
  torch::NoGradGuard no_grad;
  auto before = gpt->forward(tokens);
  gpt->set_activation_checkpointing(true);
  EXPECT_TRUE(torch::equal(before, gpt->forward(tokens)));
}

TEST(Checkpoint, ModelsThatCannotBeSplitRefuseInOneLine) {
  auto mlp = mpiddp::wrap_module(torch::nn::Linear(3, 2), "linear");
  const auto e = error_of([&] { mlp->set_activation_checkpointing(true); });
  EXPECT_NE(e.find("activation checkpointing: the model (linear) cannot be split into blocks"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
  EXPECT_EQ(error_of([&] { mlp->set_activation_checkpointing(false); }), "");
  auto gpt = mpiddp::wrap_module(mpiddp::Gpt(dropout_gpt()), "gpt");
  EXPECT_EQ(error_of([&] { gpt->set_activation_checkpointing(true); }), "");
  EXPECT_TRUE(std::dynamic_pointer_cast<mpiddp::GptImpl>(gpt->module())->activation_checkpointing());
}
