#include "train/evaluation.hpp"

#include <algorithm>

#include "common/even_share.hpp"
#include "train/forward_loss.hpp"
#include "train/task.hpp"
#include "zero/model_sharding.hpp"

namespace mpiddp::detail {

std::pair<double, double> evaluate(const SampleSet& test, const Task& task, const ForwardLoss& forward,
                                   const ModelSharding& sharding, ProcessGroup& pg, int64_t train_batch) {
  torch::NoGradGuard no_grad;
  Model& model = forward.model();
  model.train(false);
  const auto device = forward.device();
  const int64_t n = test.size();
  const Share mine_share = share_of(n, pg.rank(), pg.size());
  const int64_t begin = mine_share.first, end = mine_share.end();
  const int64_t batch = task.eval_batch(train_batch);
  // The loss is the training loss (a mean) times each batch's size.
  double loss_sum = 0, correct = 0;
  for (int64_t b = begin; b < end; b += batch) {
    auto e = test.read_range(b, std::min(batch, end - b));
    auto y = e.targets.to(device);
    const auto [out, loss] = forward(e.inputs.to(device), y);
    loss_sum += loss.item<double>() * static_cast<double>(y.size(0));
    if (task.has_labels()) correct += task.correct(out, y);
  }
  // A sharded forward is collective: a rank with fewer batches than the largest share runs the
  // difference on one sample, and discards it.
  const int64_t most = (largest_share(n, pg.size()) + batch - 1) / batch, mine = (end - begin + batch - 1) / batch;
  for (int64_t k = 0; k < sharding.lockstep_forwards(mine, most); ++k) {
    auto e = test.read_range(0, 1);
    forward(e.inputs.to(device), e.targets.to(device));
  }
  auto sums = torch::tensor({loss_sum, correct}, torch::kDouble).to(device);
  pg.allreduce(sums);
  sums = sums.cpu();
  model.train(true);
  const double total = static_cast<double>(n);
  const double predictions = total * static_cast<double>(task.predictions_per_sample());
  return {sums[0].item<double>() / total, task.has_labels() ? sums[1].item<double>() / predictions : -1.0};
}

}  // namespace mpiddp::detail
