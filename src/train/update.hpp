// Update: what a step does with the gradients its reduction left. DDP's (ZeRO stage 0): every rank
// holds the averaged gradients, unscales them (fp16: an Inf/NaN on any rank skips the step
// everywhere, GradScaler's verdict), clips them to the global norm and steps the optimizer on every
// parameter. ZeRO's (stages 1, 2: a ZeroOptimizer): the same on this rank's shards, the norm and
// the verdict over all ranks' shards, then the parameters all-gathered (stage 3: the units' slices).
//
// Cross-rank contract: every rank calls apply() at the same steps (after StepAgreement settled
// that the step's loss was finite everywhere); fp16's verdict is one all-reduce inside it, ZeRO's
// norm another.
#pragma once

#include <mpiddp/ddp.hpp>
#include <mpiddp/precision.hpp>
#include <mpiddp/process_group.hpp>
#include <mpiddp/trainer.hpp>
#include <mpiddp/zero.hpp>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common/run_position.hpp"
#include "zero/model_sharding.hpp"

namespace mpiddp::detail {

class Update {
 public:
  /// `params`: what clipping and unscaling see (the trainable parameters). The fp16 scaler
  /// continues from `from` (a snapshot's state) when it holds one. Under ZeRO the optimizer is
  /// sharded over `ddp` (its reduction says the stage), taking the state a resume put in it, and the
  /// model held as `sharding` says (sharded units run through its gathers while this Update lives;
  /// `initialise_units`: deferred units get their initial values, else a resume reads them next).
  Update(torch::optim::Optimizer& optimizer, std::vector<torch::Tensor> params, const TrainerOptions& options,
         ProcessGroup& pg, const RunPosition& from, DistributedDataParallel& ddp, ModelSharding& sharding,
         bool initialise_units = true);
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
  ZeroOptimizer* zero() const { return zero_.get(); }

 private:
  torch::optim::Optimizer& optimizer_;
  std::vector<torch::Tensor> params_;
  double clip_grad_norm_;
  ProcessGroup& pg_;
  std::optional<GradScaler> scaler_;
  std::unique_ptr<ZeroOptimizer> zero_;
  ModelSharding& sharding_;
};

}  // namespace mpiddp::detail
