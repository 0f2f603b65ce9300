// The built-in GPT against nanoGPT's published rules: its state_dict names, the tied weight, the
// initialisation's distribution, causality, shapes; GptConfig's checks and JSON.
#include <mpiddp/error.hpp>
#include <mpiddp/gpt.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/trainer.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "error_of.hpp"
#include "snapshot/snapshot_codec.hpp"

using mpiddp::testing::error_of;

namespace {

mpiddp::GptConfig small(int64_t layers = 2, bool bias = true) {
  mpiddp::GptConfig c;
  c.n_layer = layers;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = 32;
  c.vocab_size = 512;
  c.bias = bias;
  return c;
}

}  // namespace

TEST(Gpt, NamesAreNanoGptsStateDictKeysInOrder) {
  mpiddp::Gpt gpt(small(1));
  std::vector<std::string> names;
  for (const auto& p : gpt->named_parameters()) names.push_back(p.key());
  const std::vector<std::string> want = {"transformer.wte.weight",
                                         "transformer.wpe.weight",
                                         "transformer.h.0.ln_1.weight",
                                         "transformer.h.0.ln_1.bias",
                                         "transformer.h.0.attn.c_attn.weight",
                                         "transformer.h.0.attn.c_attn.bias",
                                         "transformer.h.0.attn.c_proj.weight",
                                         "transformer.h.0.attn.c_proj.bias",
                                         "transformer.h.0.ln_2.weight",
                                         "transformer.h.0.ln_2.bias",
                                         "transformer.h.0.mlp.c_fc.weight",
                                         "transformer.h.0.mlp.c_fc.bias",
                                         "transformer.h.0.mlp.c_proj.weight",
                                         "transformer.h.0.mlp.c_proj.bias",
                                         "transformer.ln_f.weight",
                                         "transformer.ln_f.bias",
                                         "lm_head.weight"};
  EXPECT_EQ(names, want);
  mpiddp::Gpt no_bias(small(1, false));
  for (const auto& p : no_bias->named_parameters()) EXPECT_EQ(p.key().find("bias"), std::string::npos) << p.key();
}

TEST(Gpt, LmHeadIsTheTokenEmbeddingAndCountsOnce) {
  mpiddp::Gpt gpt(small());
  const auto params = gpt->named_parameters();
  EXPECT_TRUE(params["lm_head.weight"].is_same(params["transformer.wte.weight"]));
  const auto model = mpiddp::wrap_module(gpt);
  const auto unique = mpiddp::parameters(*model);
  EXPECT_EQ(unique.size(), params.size() - 1);
  // A gradient through both uses lands in the one tensor.
  auto idx = torch::randint(0, 512, {2, 8}, torch::kLong);
  gpt->forward(idx).sum().backward();
  EXPECT_TRUE(params["lm_head.weight"].grad().defined());
  EXPECT_TRUE(params["lm_head.weight"].grad().is_same(params["transformer.wte.weight"].grad()));
}

TEST(Gpt, InitialisationIsNanoGpts) {
  torch::manual_seed(0);
  const auto c = small(4);
  mpiddp::Gpt gpt(c);
  const double residual = 0.02 / std::sqrt(2.0 * 4);
  for (const auto& p : gpt->named_parameters()) {
    const auto& name = p.key();
    const auto& t = p.value();
    if (name.find(".ln_") != std::string::npos || name.rfind("transformer.ln_f", 0) == 0) {
      EXPECT_TRUE(
          torch::equal(t, name.find("weight") != std::string::npos ? torch::ones_like(t) : torch::zeros_like(t)))
          << name;
    } else if (name.size() > 4 && name.substr(name.size() - 4) == "bias") {
      EXPECT_EQ(t.abs().max().item<double>(), 0.0) << name;
    } else {
      const double want = name.find("c_proj.weight") != std::string::npos ? residual : 0.02;
      EXPECT_NEAR(t.mean().item<double>(), 0.0, 4 * want / std::sqrt(static_cast<double>(t.numel()))) << name;
      EXPECT_NEAR(t.std().item<double>(), want, 0.05 * want) << name;  // >= 1024 draws each
    }
  }
}

TEST(Gpt, LogitsOfEveryPositionAndCausal) {
  torch::manual_seed(1);
  mpiddp::Gpt gpt(small());
  gpt->eval();
  auto idx = torch::randint(0, 512, {3, 20}, torch::kLong);
  const auto logits = gpt->forward(idx);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 20, 512}));
  auto later = idx.clone();
  later.narrow(1, 12, 8).random_(0, 512);  // change only positions 12..19
  const auto again = gpt->forward(later);
  EXPECT_TRUE(torch::allclose(logits.narrow(1, 0, 12), again.narrow(1, 0, 12), 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(logits.narrow(1, 12, 8), again.narrow(1, 12, 8), 1e-5, 1e-6));
  EXPECT_NE(error_of([&] {
              gpt->forward(torch::zeros({1, 33}, torch::kLong));
            }).find("block size is only 32"),
            std::string::npos);
}

TEST(Gpt, GreedyGenerationTakesTheArgmaxAndCropsTheContext) {
  torch::manual_seed(2);
  mpiddp::Gpt gpt(small());
  gpt->eval();
  auto idx = torch::randint(0, 512, {1, 30}, torch::kLong);
  const auto out = gpt->generate(idx, 6, 1.0, 1);
  ASSERT_EQ(out.size(1), 36);
  EXPECT_TRUE(torch::equal(out.narrow(1, 0, 30), idx));
  for (int64_t i = 30; i < 36; ++i) {
    const auto context = out.narrow(1, std::max<int64_t>(0, i - 32), std::min<int64_t>(i, 32));
    torch::NoGradGuard no_grad;
    EXPECT_EQ(out[0][i].item<int64_t>(), gpt->forward(context)[0][context.size(1) - 1].argmax().item<int64_t>());
  }
}

TEST(GptConfig, ChecksAndJson) {
  auto c = small();
  c.n_head = 5;
  EXPECT_NE(error_of([&] { c.validate(); }).find("multiple of its heads"), std::string::npos);
  c = small(3, false);
  c.dropout = 0.25;
  const auto back = mpiddp::GptConfig::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.n_layer, 3);
  EXPECT_FALSE(back.bias);
  EXPECT_NE(error_of([] { mpiddp::GptConfig::from_json(R"({"n_layer": 2})"); }).find("lacks a field"),
            std::string::npos);
}

TEST(CosineLr, IsNanoGptsGetLr) {
  // nanoGPT: lr (it+1)/(warmup+1) while it < warmup, then min + 0.5 (1 + cos(pi r)) (lr - min),
  // r = (it - warmup) / (decay_iters - warmup).
  const auto f = mpiddp::cosine_lr(10, 0.1);
  for (int64_t it = 0; it <= 100; ++it) {
    double want;
    if (it < 10) {
      want = static_cast<double>(it + 1) / 11.0;
    } else {
      const double r = static_cast<double>(it - 10) / 90.0;
      want = 0.1 + 0.5 * (1 + std::cos(M_PI * r)) * 0.9;
    }
    EXPECT_NEAR(f({it, 0, 100}), want, 1e-12) << it;
  }
  EXPECT_DOUBLE_EQ(f({150, 0, 100}), 0.1);
}

TEST(LrSchedule, ByNameIsTheScheduleFunctions) {
  // The names `mpiddp train --lr-schedule` takes are the library's: its --help lists them, and an
  // unknown one is the library's one-line error, under the name the caller gives.
  EXPECT_EQ(mpiddp::lr_schedule_names(), (std::vector<std::string>{"none", "step", "cosine"}));
  EXPECT_EQ(error_of([] { mpiddp::check_lr_schedule_name("linear", "--lr-schedule"); }),
            "unknown --lr-schedule 'linear' (none, step, cosine)");
  EXPECT_EQ(error_of([] { mpiddp::lr_schedule_named("Cosine", {}); }),
            "unknown lr schedule 'Cosine' (none, step, cosine)");
  EXPECT_FALSE(mpiddp::lr_schedule_named("none", {}));
  const auto step = mpiddp::lr_schedule_named("step", {3, 0.5, 4, 0.0});
  const auto step_by_hand = mpiddp::with_warmup(mpiddp::step_lr(3, 0.5), 4);
  const auto warmup = mpiddp::lr_schedule_named("none", {3, 0.5, 4, 0.0});
  const auto cosine = mpiddp::lr_schedule_named("cosine", {3, 0.5, 4, 0.1});
  const auto cosine_by_hand = mpiddp::cosine_lr(4, 0.1);
  for (int64_t it = 0; it < 40; ++it) {
    const mpiddp::StepInfo at{it, it / 5, 40};
    EXPECT_DOUBLE_EQ(step(at), step_by_hand(at)) << it;
    EXPECT_DOUBLE_EQ(warmup(at), it < 4 ? static_cast<double>(it + 1) / 4.0 : 1.0) << it;
    EXPECT_DOUBLE_EQ(cosine(at), cosine_by_hand(at)) << it;
  }
}

TEST(LrSchedule, ParametersOutOfRangeAreOneRuleNamedAsTheCallerSpellsThem) {
  // Each field's rule once: the schedule functions and lr_schedule_named say the field's own name,
  // `mpiddp train` its flag's.
  EXPECT_EQ(error_of([] { mpiddp::step_lr(0, 0.5); }), "step_size must be > 0, got 0");
  EXPECT_EQ(error_of([] { mpiddp::step_lr(2, -1); }), "gamma must be > 0, got -1.000000");
  EXPECT_EQ(error_of([] { mpiddp::cosine_lr(-1, 0.1); }), "warmup_steps must be >= 0, got -1");
  EXPECT_EQ(error_of([] { mpiddp::cosine_lr(0, 1.5); }), "min_factor must be in [0, 1], got 1.500000");
  EXPECT_EQ(error_of([] { mpiddp::with_warmup(nullptr, -2); }), "warmup_steps must be >= 0, got -2");
  EXPECT_EQ(error_of([] {
              mpiddp::lr_schedule_named("none", {1, 0.1, -3, 0.0});
            }),
            "warmup_steps must be >= 0, got -3");
  const auto flag = [](const std::string& field) { return "--" + field; };
  EXPECT_EQ(error_of([&] {
              mpiddp::check_lr_schedule_params({0, 0.1, 0, 0.0}, flag);
            }),
            "--step_size must be > 0, got 0");
  EXPECT_EQ(error_of([] { mpiddp::check_lr_schedule_params({1, 0.1, 0, 1.0}); }), "");
}

TEST(Gpt, SnapshotRecordsItsShapeWhoeverTrainsIt) {
  // The snapshot codec (what Trainer::save writes, through the library or the CLI) records the
  // GPT's shape itself, so `mpiddp generate` needs no CLI options to rebuild it; other models none.
  auto cfg = small(3, false);
  cfg.dropout = 0.25;
  cfg.vocab_size = 321;
  mpiddp::Snapshot s;
  mpiddp::detail::model_to_snapshot(*mpiddp::wrap_module(mpiddp::Gpt(cfg), "gpt"), s);
  ASSERT_EQ(s.texts.count(mpiddp::detail::kGptConfigKey), 1U);
  const auto back = mpiddp::GptConfig::from_json(s.texts.at(mpiddp::detail::kGptConfigKey));
  EXPECT_EQ(back.n_layer, 3);
  EXPECT_EQ(back.n_head, cfg.n_head);
  EXPECT_EQ(back.n_embd, cfg.n_embd);
  EXPECT_EQ(back.block_size, cfg.block_size);
  EXPECT_EQ(back.vocab_size, 321);
  EXPECT_EQ(back.bias, false);
  EXPECT_EQ(back.dropout, 0.25);
  mpiddp::Snapshot other;
  mpiddp::detail::model_to_snapshot(*mpiddp::wrap_module(torch::nn::Linear(3, 2), "linear"), other);
  EXPECT_EQ(other.texts.count(mpiddp::detail::kGptConfigKey), 0U);
}
