// ForwardLoss: a batch's forward under autocast (TrainerOptions::precision) and its loss (the loss
// function's, or the model's own: TrainerOptions::model_loss), both handed back in float32. The
// training step, evaluation, the model's check against the data and the memory plan's probe all
// go through it, so they compute one loss alike.
//
// Cross-rank contract: none of its own; it calls the model's forward, which is local except where
// ZeRO stage 3 has sharded the model's units (each forward then gathers them: every rank runs as
// many forwards, see ModelSharding::lockstep_forwards).
#pragma once

#include <mpiddp/model.hpp>
#include <mpiddp/trainer.hpp>

#include <torch/torch.h>

#include <utility>

namespace mpiddp::detail {

class ForwardLoss {
 public:
  /// Reads `options` (device, precision, loss, model_loss) at each call: both must outlive it.
  ForwardLoss(Model& model, const TrainerOptions& options) : model_(model), options_(options) {}

  /// The model's outputs for `inputs` (on the training device), float32.
  torch::Tensor forward(const torch::Tensor& inputs) const;
  /// The outputs and the loss (a scalar: the batch's mean), float32.
  std::pair<torch::Tensor, torch::Tensor> operator()(const torch::Tensor& inputs, const torch::Tensor& targets) const;

  Model& model() const { return model_; }
  c10::Device device() const { return options_.device; }
  /// Whether the loss is the model's own (Model::forward_with_loss).
  bool model_loss() const { return options_.model_loss; }

 private:
  Model& model_;
  const TrainerOptions& options_;
};

}  // namespace mpiddp::detail
