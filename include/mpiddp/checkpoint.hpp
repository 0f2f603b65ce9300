// Activation checkpointing (torch.utils.checkpoint for libtorch, which has none): a function of
// tensors runs forward without keeping its intermediate tensors, only its inputs, and is run again
// in backward to rebuild them, with the random generators (CPU and the inputs' CUDA device) and
// autocast set as they were in forward, so dropout draws the same mask and the results are those
// of the plain run. Memory: a block's activations exist for one block at a time; cost: one more
// forward of it.
//
//   x = mpiddp::checkpoint([&](const torch::Tensor& t) { return block->forward(t); }, x, block->parameters());
//
// `parameters` must list every tensor the function reads that needs a gradient besides its
// inputs (a module's parameters()): their gradients leave the checkpoint as gradients of its
// inputs do, in the caller's backward pass, so DDP's and ZeRO's gradient hooks see them as usual.
// A tensor left out is caught in backward (mpiddp::Error naming it). Without gradient mode (eval,
// generate) the function simply runs. Not for double backward (create_graph).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace mpiddp {

using TensorsFunction = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

std::vector<torch::Tensor> checkpoint(const TensorsFunction& fn, const std::vector<torch::Tensor>& inputs,
                                      const std::vector<torch::Tensor>& parameters);
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input,
                         const std::vector<torch::Tensor>& parameters);

/// A module that can run its blocks checkpointed (the built-in GPT: each transformer block).
class Checkpointable {
 public:
  virtual ~Checkpointable() = default;
  virtual void set_activation_checkpointing(bool on) = 0;
  virtual bool activation_checkpointing() const = 0;
};

}  // namespace mpiddp
