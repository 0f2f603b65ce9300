// The training loop's pure rules: the run plan against a simulation of fit()'s loops, the snapshot
// policy and check_trainer_options().
#include <mpiddp/error.hpp>
#include <mpiddp/trainer.hpp>
#include <mpiddp/zero.hpp>

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/run_position.hpp"
#include "error_of.hpp"
#include "snapshot/snapshot_policy.hpp"

using mpiddp::detail::RunPlan;
using mpiddp::detail::RunPosition;
using mpiddp::testing::error_of;

namespace {

// fit()'s two loops written out step by step: the steps a run takes from `p`, and where it ends.
int64_t simulate_steps(const RunPlan& plan, RunPosition p) {
  int64_t steps = 0;
  for (; p.epoch < plan.epochs && p.global_step < plan.total_steps; p = p.next_epoch()) {
    while (p.step_in_epoch < plan.steps_per_epoch && p.global_step < plan.total_steps) {
      p.advance();
      ++steps;
    }
  }
  return steps;
}

}  // namespace

TEST(RunPlan, StepsLeftMatchesTheLoops) {
  for (int64_t epochs : {1, 2, 5}) {
    for (int64_t per_epoch : {1, 3, 7}) {
      for (int64_t max_steps : {0, 1, 4, 100}) {
        const RunPlan plan(epochs, per_epoch, max_steps);
        EXPECT_EQ(plan.total_steps, max_steps > 0 ? std::min(max_steps, epochs * per_epoch) : epochs * per_epoch);
        for (int64_t e = 0; e < epochs; ++e) {
          for (int64_t s = 0; s < per_epoch; ++s) {
            RunPosition p;
            p.epoch = e;
            p.step_in_epoch = s;
            p.global_step = e * per_epoch + s;
            if (p.global_step > plan.total_steps) continue;
            EXPECT_EQ(plan.steps_left(p), simulate_steps(plan, p))
                << epochs << " epochs x " << per_epoch << ", max " << max_steps << ", from " << e << "/" << s;
          }
        }
      }
    }
  }
}

TEST(RunPlan, WithoutEpochsMaxStepsTakesAsManyPassesAsItNeeds) {
  const RunPlan cut(0, 10, 25);  // 2 whole passes and half a third
  EXPECT_EQ(cut.epochs, 3);
  EXPECT_EQ(cut.total_steps, 25);
  EXPECT_EQ(simulate_steps(cut, RunPosition{}), 25);
  const RunPlan exact(0, 10, 30);
  EXPECT_EQ(exact.epochs, 3);
  EXPECT_EQ(simulate_steps(exact, RunPosition{}), 30);
  const RunPlan one(0, 10, 0);  // neither: one pass
  EXPECT_EQ(one.epochs, 1);
  EXPECT_EQ(one.total_steps, 10);
  EXPECT_EQ(RunPlan(2, 10, 25).total_steps, 20);  // --epochs given: it caps
}

TEST(RunPlan, NextEpochStartsAfresh) {
  RunPosition p;
  p.epoch = 2, p.step_in_epoch = 5, p.global_step = 40, p.loss_sum = 3.5, p.seconds = 1.25, p.skipped = 1;
  const RunPosition n = p.next_epoch();
  EXPECT_EQ(n.epoch, 3);
  EXPECT_EQ(n.step_in_epoch, 0);
  EXPECT_EQ(n.global_step, 40);
  EXPECT_EQ(n.loss_sum, 0);
  EXPECT_EQ(n.seconds, 0);
  EXPECT_EQ(n.skipped, 1);  // counted over the whole run
}

TEST(SnapshotPolicy, EveryNStepsAtStopsAndAtTheLastEpoch) {
  mpiddp::TrainerOptions o;
  o.save_every_steps = 3;
  o.save_every = 2;
  EXPECT_FALSE(mpiddp::detail::SnapshotPolicy(o).after_step(RunPosition{}, true));  // no directory: never
  o.snapshot_dir = "snaps";
  const mpiddp::detail::SnapshotPolicy policy(o);
  std::vector<int64_t> saved;
  RunPosition p;
  for (int i = 0; i < 10; ++i) {
    p.advance();
    if (policy.after_step(p, false)) saved.push_back(p.global_step);
  }
  EXPECT_EQ(saved, (std::vector<int64_t>{3, 6, 9}));
  p.global_step = 10;
  EXPECT_TRUE(policy.after_step(p, true));
  p.epoch = 0;  // epoch 1 of a run that goes on: not due (every 2 epochs)
  EXPECT_FALSE(policy.after_epoch(p, false));
  EXPECT_TRUE(policy.after_epoch(p, true));
  p.epoch = 1;
  EXPECT_TRUE(policy.after_epoch(p, false));
}

TEST(TrainerOptionsValidate, EachRuleNamesItsField) {
  mpiddp::TrainerOptions good;
  good.data = "train.h5";
  EXPECT_EQ(error_of([&] { mpiddp::check_trainer_options(good); }), "");
  const auto flag = [](const std::string& field) { return "--" + field; };
  struct Case {
    std::function<void(mpiddp::TrainerOptions&)> spoil;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](auto& o) { o.data.clear(); }, "--data (the training set) is required"},
      {[](auto& o) { o.epochs = -1; }, "--epochs must be >= 0 (0: as many as --max_steps takes), got -1"},
      {[](auto& o) { o.batch_size = -2; }, "--batch_size must be > 0, got -2"},
      {[](auto& o) { o.max_steps = -1; }, "--max_steps must be >= 0"},
      {[](auto& o) { o.log_every_steps = -2; }, "--log_every_steps must be >= -1"},
      {[](auto& o) { o.log_min_gap_seconds = -1; }, "must be >= 0"},
      {[](auto& o) { o.clip_grad_norm = -0.5; }, "--clip_grad_norm must be >= 0 (0: no clipping)"},
      {[](auto& o) { o.precision = c10::kDouble; }, "--precision must be kFloat, kBFloat16 or kHalf"},
      {[](auto& o) { o.loss_scaling.init_scale = 0; }, "--loss_scaling.init_scale must be > 0"},
      {[](auto& o) { o.save_every = -1; }, "--save_every must be >= 0"},
      {[](auto& o) { o.save_every_steps = -1; }, "--save_every_steps must be >= 0"},
      {[](auto& o) { o.keep = -1; }, "--keep must be >= 0"},
      {[](auto& o) { o.cache_bytes = -1; }, "--cache_bytes must be >= 0"},
      {[](auto& o) { o.prefetch_batches = -1; }, "--prefetch_batches must be >= 0 (0: no reader thread), got -1"},
      {[](auto& o) { o.resume.clear(); }, "--resume takes auto, never or a snapshot file"},
      {[](auto& o) { o.data_format = "csv"; }, "unknown --data_format 'csv' (auto, hdf5, llmc, raw-uint16)"},
      {[](auto& o) { o.zero_stage = 4; },
       "--zero_stage must be 0 (DDP), 1 (optimizer state sharded), 2 (and gradients) or 3"},
      // The reduction is the Trainer's (from zero_stage): a library user who sets it is told, not overruled.
      {[](auto& o) { o.ddp.reduction = mpiddp::zero_reduction(2); },
       "--ddp.reduction is the Trainer's to choose: set --zero_stage"},
      {[](auto& o) { o.ddp.mean_tail_values = 2; }, "--ddp.mean_tail_values is the Trainer's (its step agreement)"},
  };
  for (const auto& c : cases) {
    mpiddp::TrainerOptions o = good;
    c.spoil(o);
    EXPECT_NE(error_of([&] { mpiddp::check_trainer_options(o, flag); }).find(c.says), std::string::npos) << c.says;
  }
  mpiddp::TrainerOptions o = good;
  o.epochs = -1;
  EXPECT_EQ(error_of([&] { mpiddp::check_trainer_options(o); }),
            "TrainerOptions::epochs must be >= 0 (0: as many as TrainerOptions::max_steps takes), got -1");
  // A missing resume file is reported by rank 0 (every rank then opens it).
  o = good;
  o.resume = "/nonexistent/snapshot.h5";
  EXPECT_EQ(error_of([&] { mpiddp::check_trainer_options(o, nullptr, 0); }),
            "TrainerOptions::resume: snapshot '/nonexistent/snapshot.h5' does not exist");
  EXPECT_EQ(error_of([&] { mpiddp::check_trainer_options(o, nullptr, 1); }), "");
}
