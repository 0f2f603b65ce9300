#include "train/task.hpp"

#include <mpiddp/error.hpp>

#include "common/text.hpp"

namespace mpiddp::detail {

double Task::correct(const torch::Tensor& out, const torch::Tensor& targets) const {
  return out.argmax(-1).eq(targets).sum().item<double>();
}

namespace {

class Classification : public Task {
 public:
  void check_outputs(const torch::Tensor& out, const torch::Tensor& targets) const override {
    const int64_t n = targets.size(0);
    MPIDDP_CHECK(out.dim() == 2 && out.size(0) == n, "the model's outputs for " + std::to_string(n) + " samples are " +
                                                         shape_text(out.sizes()) + "; class labels need [" +
                                                         std::to_string(n) + ", classes]");
  }
  LossFn default_loss() const override { return cross_entropy_loss(); }
};

class Regression : public Task {
 public:
  void check_outputs(const torch::Tensor& out, const torch::Tensor& targets) const override {
    MPIDDP_CHECK(out.sizes() == targets.sizes(), "the model's outputs for " + std::to_string(targets.size(0)) +
                                                     " samples are " + shape_text(out.sizes()) +
                                                     " but the targets are " + shape_text(targets.sizes()));
  }
  LossFn default_loss() const override { return mse_loss(); }
  bool has_labels() const override { return false; }
};

// Windows of block_size tokens whose targets are the next token at every position.
class NextToken : public Task {
 public:
  explicit NextToken(int64_t block_size) : block_size_(block_size) {}
  torch::Tensor probe_inputs(const torch::Tensor& inputs) const override { return torch::zeros_like(inputs); }
  void check_outputs(const torch::Tensor& out, const torch::Tensor& targets) const override {
    const int64_t n = targets.size(0);
    const auto t = std::to_string(block_size_);
    MPIDDP_CHECK(out.dim() == 3 && out.size(0) == n && out.size(1) == block_size_,
                 "the model's outputs for " + std::to_string(n) + " windows of " + t + " tokens are " +
                     shape_text(out.sizes()) + "; token data needs logits [" + std::to_string(n) + ", " + t +
                     ", vocabulary]");
  }
  LossFn default_loss() const override { return cross_entropy_loss(); }
  int64_t predictions_per_sample() const override { return block_size_; }
  int64_t eval_batch(int64_t train_batch) const override { return train_batch; }
  int64_t tokens_per_sample() const override { return block_size_; }

 private:
  int64_t block_size_;
};

}  // namespace

std::unique_ptr<Task> task_of(const DatasetInfo& data) {
  if (data.block_size > 0) return std::make_unique<NextToken>(data.block_size);
  if (data.classification) return std::make_unique<Classification>();
  return std::make_unique<Regression>();
}

}  // namespace mpiddp::detail
