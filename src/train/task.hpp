// Task: what a training set asks of a model, read from its DatasetInfo: class labels
// (classification), real-valued targets (regression) or the next token of each position (token
// windows). The Trainer asks it, never the set's flags: how to probe the model, which outputs fit,
// the default loss, what a correct prediction is, how large an evaluation batch is, and what the
// throughput counts (samples, or tokens).
#pragma once

#include <mpiddp/data.hpp>
#include <mpiddp/trainer.hpp>

#include <torch/torch.h>

#include <memory>
#include <string>

namespace mpiddp::detail {

class Task {
 public:
  virtual ~Task() = default;
  /// The inputs of a probe forward made from the set's first samples (token data: token 0 only,
  /// which every vocabulary has).
  virtual torch::Tensor probe_inputs(const torch::Tensor& inputs) const { return inputs; }
  /// Throws mpiddp::Error (one line) when the model's outputs for the probe do not fit the targets.
  virtual void check_outputs(const torch::Tensor& out, const torch::Tensor& targets) const = 0;
  virtual LossFn default_loss() const = 0;
  /// Correct predictions in a batch, for a task with labels (classes are the last dimension).
  virtual double correct(const torch::Tensor& out, const torch::Tensor& targets) const;
  /// Predictions per sample that accuracy divides by (token windows: one per position).
  virtual int64_t predictions_per_sample() const { return 1; }
  /// Samples per evaluation batch, given the training batch (token windows hold logits per position).
  virtual int64_t eval_batch(int64_t /*train_batch*/) const { return kEvalBatchSamples; }
  /// What throughput also counts per sample: tokens for token windows (0: samples alone).
  virtual int64_t tokens_per_sample() const { return 0; }
  /// Whether targets are class labels the outputs' last dimension must cover (SampleSet::check_labels)
  /// and accuracy counts.
  virtual bool has_labels() const { return true; }

  /// Samples per evaluation batch of a set of fixed-size samples.
  static constexpr int64_t kEvalBatchSamples = 1000;
};

/// The task of a training set.
std::unique_ptr<Task> task_of(const DatasetInfo& data);

}  // namespace mpiddp::detail
