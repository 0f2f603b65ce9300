// A step's forward and backward over its micro-batches (TrainerOptions::grad_accum): all but the
// last accumulate gradients locally (DDP's no_sync); the last one's backward reduces their sum
// across the ranks, the StepAgreement's flags riding with it. Each loss is divided by the number of
// micro-batches, so the gradient is that of their mean. Nothing here waits for the device: the
// host queues the backward while the forward still runs (the agreement judges the loss there too).
//
// Cross-rank contract: every rank calls it once per optimizer step with a batch of the same size
// (so as many micro-batches), and posts to the agreement before the one reducing backward.
#pragma once

#include <mpiddp/data.hpp>
#include <mpiddp/ddp.hpp>

#include <torch/torch.h>

#include <cstdint>

namespace mpiddp::detail {

class ForwardLoss;
class StepAgreement;
class Update;

/// Forward and backward of `step` as `micro_batches` micro-batches of equal size, in order. Returns
/// this rank's loss for the step (their mean, float64) where the model is (not waited for).
torch::Tensor micro_steps(const Example& step, int64_t micro_batches, const ForwardLoss& forward,
                          DistributedDataParallel& ddp, StepAgreement& agreement, const Update& update);

}  // namespace mpiddp::detail
