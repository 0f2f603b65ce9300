// Where a training run stands (RunPosition: what fit() carries from step to step and a snapshot
// stores) and how far it goes (RunPlan). Every rank holds the same position at every step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace mpiddp::detail {

struct RunPosition {
  int64_t epoch = 0;          ///< the epoch in progress (0-based)
  int64_t step_in_epoch = 0;  ///< its steps already taken
  int64_t global_step = 0;
  double loss_sum = 0;  ///< sum of its steps' losses so far
  double seconds = 0;   ///< its training time so far
  int64_t skipped = 0;  ///< steps skipped for a NaN/Inf loss, in all
  double lr = 0;
  int64_t overflow = 0;   ///< fp16: steps loss scaling skipped, in all
  double loss_scale = 0;  ///< fp16: the scaler's state (0: none saved)
  int64_t growth_tracker = 0;

  /// After a step: one more in the epoch and in all.
  void advance() {
    ++step_in_epoch;
    ++global_step;
  }
  /// The same run at the start of the next epoch (what an end-of-epoch snapshot stores).
  RunPosition next_epoch() const {
    RunPosition next = *this;
    ++next.epoch;
    next.step_in_epoch = 0;
    next.loss_sum = next.seconds = 0;
    return next;
  }
  /// "global step G (epoch E, step S)", as errors and notes name a step (E 1-based).
  std::string where() const {
    return "global step " + std::to_string(global_step) + " (epoch " + std::to_string(epoch + 1) + ", step " +
           std::to_string(step_in_epoch) + ")";
  }
};

/// The run's extent: epochs of steps_per_epoch steps, capped at total_steps (TrainerOptions::max_steps).
struct RunPlan {
  int64_t epochs = 0, steps_per_epoch = 0, total_steps = 0;

  /// `epochs_` 0: as many passes as `max_steps` takes (the last one cut short), or one without it.
  RunPlan(int64_t epochs_, int64_t steps_per_epoch_, int64_t max_steps)
      : epochs(epochs_ > 0     ? epochs_
               : max_steps > 0 ? (max_steps + steps_per_epoch_ - 1) / steps_per_epoch_
                               : 1),
        steps_per_epoch(steps_per_epoch_),
        total_steps(max_steps > 0 ? std::min(max_steps, epochs * steps_per_epoch_) : epochs * steps_per_epoch_) {}

  bool running(const RunPosition& p) const { return p.epoch < epochs && p.global_step < total_steps; }
  bool epoch_running(const RunPosition& p) const {
    return p.step_in_epoch < steps_per_epoch && p.global_step < total_steps;
  }
  /// Whether every step of the epoch at `p` is taken (not cut short by total_steps).
  bool epoch_done(const RunPosition& p) const { return p.step_in_epoch >= steps_per_epoch; }
  /// Whether the epoch just finished at `p` is the run's last.
  bool last_epoch(const RunPosition& p) const { return p.epoch + 1 == epochs || p.global_step >= total_steps; }
  /// Steps from the start of epoch 0 to `p` in the loop's order (the batch source's index).
  int64_t offset(const RunPosition& p) const { return p.epoch * steps_per_epoch + p.step_in_epoch; }
  /// Steps left from `p` to the end of the run.
  int64_t steps_left(const RunPosition& p) const {
    return std::max<int64_t>(0, std::min(total_steps - p.global_step, epochs * steps_per_epoch - offset(p)));
  }
};

}  // namespace mpiddp::detail
