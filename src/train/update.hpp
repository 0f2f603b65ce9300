// Update: what a step does with the gradients its reduction left. DDP's (ZeRO stage 0): every rank
// holds the averaged gradients, unscales them (fp16: an Inf/NaN on any rank skips the step
// everywhere, GradScaler's verdict), clips them to the global norm and steps the optimizer on every
// parameter. ZeRO's (stages 1, 2: a ZeroOptimizer): the same on this rank's shards, the norm and
// the verdict over all ranks' shards, then the parameters all-gathered.
//
// Cross-rank contract: every rank calls apply() at the same steps (after StepAgreement settled
// that the step's loss was finite everywhere); fp16's verdict is one all-reduce inside it, ZeRO's
// norm another.
#pragma once

#include <mpiddp/process_group.hpp>
#include <mpiddp/ddp.hpp>
#include <mpiddp/precision.hpp>
#include <mpiddp/trainer.hpp>
#include <mpiddp/zero.hpp>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "train/run_position.hpp"

namespace mpiddp::detail {

class Update {
 public:
  /// `params`: what clipping and unscaling see (the trainable parameters). The fp16 scaler
  /// continues from `from` (a snapshot's state) when it holds one. Under ZeRO the optimizer is
  /// sharded over `ddp` (its reduction says the stage), taking the state a resume put in it; at
  /// stage 3 `initialise_units` has the model's deferred units initialised (units.hpp), else they
  /// start as zeros (a resume reads them next). `zero`: ZeRO's options, else `options`'.
  Update(torch::optim::Optimizer& optimizer, std::vector<torch::Tensor> params, const TrainerOptions& options,
         ProcessGroup& pg, const RunPosition& from, DistributedDataParallel& ddp, Model& model,
         bool initialise_units = true, const ZeroOptions* zero = nullptr);
  ~Update();
  Update(const Update&) = delete;
  Update& operator=(const Update&) = delete;

  /// The loss to differentiate: scaled by the fp16 loss scale, else as it is.
  torch::Tensor scale(const torch::Tensor& loss) const { return scaler_ ? scaler_->scale(loss) : loss; }
  /// Unscale, clip, step. False when fp16 loss scaling skipped the step (Inf/NaN gradients).
  bool apply();
  /// The scaler's state into `p` (snapshots); nothing without loss scaling.
  void save_state(RunPosition& p) const;
  /// The loss scale now (0: no loss scaling).
  double loss_scale() const { return scaler_ ? scaler_->scale_value() : 0.0; }
  /// The ZeroOptimizer that shards the optimizer (null at stage 0): snapshots write its slices.
  /// At stage 3 the model's units run through its hooks while this Update lives.
  ZeroOptimizer* zero() const { return zero_.get(); }

 private:
  torch::optim::Optimizer& optimizer_;
  std::vector<torch::Tensor> params_;
  double clip_grad_norm_;
  ProcessGroup& pg_;
  std::optional<GradScaler> scaler_;
  std::unique_ptr<ZeroOptimizer> zero_;
  Model& model_;
};

}  // namespace mpiddp::detail
