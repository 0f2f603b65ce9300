#include "train/micro_steps.hpp"

#include <vector>

#include "train/forward_loss.hpp"
#include "train/step_agreement.hpp"
#include "train/update.hpp"

namespace mpiddp::detail {

namespace {
// A step's rows as `k` micro-batches of equal size, in order.
std::vector<Example> split_micro_batches(const Example& step, int64_t k) {
  if (k == 1) return {step};
  const int64_t rows = step.inputs.size(0) / k;
  std::vector<Example> out;
  for (int64_t i = 0; i < k; ++i)
    out.push_back({step.inputs.narrow(0, i * rows, rows), step.targets.narrow(0, i * rows, rows)});
  return out;
}
}  // namespace

torch::Tensor micro_steps(const Example& step, int64_t micro_batches, const ForwardLoss& forward,
                          DistributedDataParallel& ddp, StepAgreement& agreement, const Update& update) {
  const std::vector<Example> parts = split_micro_batches(step, micro_batches);
  const auto device = forward.device();
  const auto k = static_cast<double>(parts.size());
  torch::Tensor loss_sum;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Example& e = parts[i];
    auto loss = forward(device.is_cpu() ? e.inputs : e.inputs.to(device, /*non_blocking=*/true),
                        device.is_cpu() ? e.targets : e.targets.to(device, /*non_blocking=*/true))
                    .second;
    const auto value = loss.detach().to(torch::kDouble);
    loss_sum = loss_sum.defined() ? loss_sum + value : value;  // not finite iff some loss is not
    if (parts.size() > 1) loss = loss / k;
    if (i + 1 < parts.size()) {
      auto local = ddp.no_sync();
      ddp.backward(update.scale(loss));
    } else {
      agreement.post(loss_sum);
      ddp.backward(update.scale(loss));
    }
  }
  return parts.size() > 1 ? loss_sum / k : loss_sum;
}

}  // namespace mpiddp::detail
