// StepAgreement: one verdict per step for all ranks, so that every rank takes the same branch at the
// same step: whether any rank has a stop signal pending (SIGTERM/SIGUSR1) and whether any rank's
// loss is not finite.
//
// Cross-rank contract: every rank posts before the step's gradient reduction and settles after it.
// The flags ride in `slots`, values that the step's gradient collective all-reduces as a mean
// (DdpOptions::mean_tail_values: at the end of DDP's last bucket, or alone after the buckets when
// they are reduce-scattered), so under DDP the agreement costs no collective of its own.
// Only when a flag is set, on every rank alike, does settle() run a second all-reduce (max) that
// names the signal and the highest rank with a bad loss. fp16 overflow has its own verdict, in the
// update (GradScaler::unscale).
#pragma once

#include <mpiddp/process_group.hpp>

#include <torch/types.h>

namespace mpiddp::detail {

class StepAgreement {
 public:
  /// Values a step's gradient collective must carry for the agreement.
  static constexpr int64_t kSlots = 2;

  struct Verdict {
    int stop_signal = 0;  ///< the signal that stops every rank after this step (0: none)
    int bad_rank = -1;    ///< the highest rank whose loss was NaN/Inf (-1: none)
  };

  /// `slots`: kSlots values all-reduced (mean) by each step's gradient collective.
  StepAgreement(torch::Tensor slots, ProcessGroup& pg);
  /// This rank's flags, before the reducing backward; `loss` the step's (a scalar where the model
  /// is). Off the CPU its finiteness is judged on the device: posting never waits for the forward.
  void post(const torch::Tensor& loss);
  /// Every rank's verdict, after it; collective only when some rank raised a flag.
  Verdict settle();

 private:
  torch::Tensor slots_;
  ProcessGroup& pg_;
  // Written and read through a CPU float32 tensor: the slots themselves when they are one (no
  // operator call per step), else a copy.
  bool direct_;
  torch::Tensor staging_;
  float* flags_;
  int pending_signal_ = 0;
  torch::Tensor loss_;  ///< the posted loss (read by settle() only when some rank's was not finite)
};

}  // namespace mpiddp::detail
