#include "train/update.hpp"

#include <mpiddp/optim.hpp>

#include <cmath>

namespace mpiddp::detail {

Update::Update(torch::optim::Optimizer& optimizer, std::vector<torch::Tensor> params, const TrainerOptions& options,
               ProcessGroup& pg, const RunPosition& from, DistributedDataParallel& ddp, ModelSharding& sharding,
               bool initialise_units)
    : optimizer_(optimizer),
      params_(std::move(params)),
      clip_grad_norm_(options.clip_grad_norm),
      pg_(pg),
      sharding_(sharding) {
  if (ddp.reduction().zero_stage() > 0) {
    zero_ = std::make_unique<ZeroOptimizer>(ddp, optimizer, sharding.zero_options(initialise_units));
  }
  if (options.precision == c10::kHalf) {  // dynamic loss scaling, continued from the snapshot
    scaler_.emplace(options.device, options.loss_scaling);
    if (from.loss_scale > 0) scaler_->load(from.loss_scale, from.growth_tracker);
  }
  sharding_.attach(zero_.get());  // last: nothing after it throws (~Update detaches)
}

Update::~Update() { sharding_.detach(); }  // before the ZeroOptimizer makes the model whole

bool Update::apply() {
  // fp16: the averaged gradients (under ZeRO each rank's shards) are unscaled and checked; a step
  // with an Inf/NaN gradient on any rank is skipped everywhere.
  const bool overflow = scaler_ && scaler_->unscale(zero_ ? zero_->shards() : params_, &pg_);
  if (!overflow) {
    if (zero_) {
      if (clip_grad_norm_ > 0) zero_->clip_grad_norm(clip_grad_norm_);
      zero_->step();
    } else {
      if (clip_grad_norm_ > 0) clip_grads_to(params_, grad_squared_norm(params_), clip_grad_norm_);  // on the device
      optimizer_.step();
    }
  }
  if (scaler_) scaler_->update();
  return !overflow;
}

void Update::save_state(RunPosition& p) const {
  if (!scaler_) return;
  p.loss_scale = scaler_->scale_value();
  p.growth_tracker = scaler_->growth_tracker();
}

}  // namespace mpiddp::detail
