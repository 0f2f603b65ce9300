// Where a training run stands: what fit() carries from step to step and a snapshot stores.
#pragma once

#include <mpiddp/trainer.hpp>

namespace mpiddp {

struct Trainer::Progress {
  int64_t epoch = 0;          ///< the epoch in progress (0-based)
  int64_t step_in_epoch = 0;  ///< its steps already taken
  int64_t global_step = 0;
  double loss_sum = 0;        ///< sum of its steps' losses so far
  double seconds = 0;         ///< its training time so far
  int64_t skipped = 0;        ///< steps skipped for a NaN/Inf loss, in all
  double lr = 0;
  int64_t overflow = 0;       ///< fp16: steps loss scaling skipped, in all
  double loss_scale = 0;      ///< fp16: the scaler's state (0: none saved)
  int64_t growth_tracker = 0;
};

}  // namespace mpiddp
