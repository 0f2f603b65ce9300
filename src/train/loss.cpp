// The losses the Trainer offers; a set's default is its Task's (task.hpp).
#include <mpiddp/trainer.hpp>

#include "train/task.hpp"

namespace mpiddp {

LossFn cross_entropy_loss() {
  return [](const torch::Tensor& out, const torch::Tensor& y) {
    namespace F = torch::nn::functional;
    if (out.dim() <= 2) return F::cross_entropy(out, y);
    return F::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}),
                            F::CrossEntropyFuncOptions().ignore_index(-1));
  };
}

LossFn mse_loss() {
  return [](const torch::Tensor& out, const torch::Tensor& y) { return torch::mse_loss(out, y.to(out.scalar_type())); };
}

LossFn default_loss(const DatasetInfo& data) { return detail::task_of(data)->default_loss(); }

}  // namespace mpiddp
