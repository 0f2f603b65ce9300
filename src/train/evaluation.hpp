// Evaluation on the test set after an epoch: the mean loss (the training loss, through ForwardLoss)
// and, for a task with labels, the accuracy.
//
// Cross-rank contract: collective; every rank calls it at the same epoch end. Each rank scores a
// contiguous slice of the test set, [n*r/w, n*(r+1)/w) (no padding: every sample counts once), and
// the sums (loss times batch size, correct predictions) are all-reduced once, so every rank
// returns the same figures. Where ZeRO stage 3 shards the model each forward is collective too:
// the ModelSharding says how many forwards on one sample a rank with fewer batches than the largest
// slice adds (and discards), so that every rank runs as many.
#pragma once

#include <mpiddp/data.hpp>
#include <mpiddp/process_group.hpp>

#include <cstdint>
#include <utility>

namespace mpiddp::detail {

class ForwardLoss;
class ModelSharding;
class Task;

/// {mean loss, accuracy (-1: the task has no labels)} over `test`, in evaluation mode without
/// gradients (the model is back in training mode after). `train_batch`: the training batch, which
/// sets the evaluation batch for token windows (Task::eval_batch).
std::pair<double, double> evaluate(const SampleSet& test, const Task& task, const ForwardLoss& forward,
                                   const ModelSharding& sharding, ProcessGroup& pg, int64_t train_batch);

}  // namespace mpiddp::detail
