#include "train/step_agreement.hpp"

#include "train/stop_signals.hpp"

#include <cmath>

namespace mpiddp::detail {

StepAgreement::StepAgreement(torch::Tensor slots, ProcessGroup& pg)
    : slots_(std::move(slots)),
      pg_(pg),
      direct_(slots_.is_cpu() && slots_.scalar_type() == torch::kFloat),
      staging_(direct_ ? slots_ : torch::zeros({kSlots}, torch::kFloat)),
      flags_(staging_.data_ptr<float>()) {}

void StepAgreement::post(const torch::Tensor& loss) {
  pending_signal_ = StopSignals::pending();
  loss_ = loss;
  // [ranks stopping, ranks with a bad loss] / size
  if (direct_) {
    flags_[0] = pending_signal_ != 0 ? 1.0F : 0.0F;
    flags_[1] = std::isfinite(loss.item<double>()) ? 0.0F : 1.0F;
    return;
  }
  torch::NoGradGuard no_grad;
  slots_.narrow(0, 0, 1).fill_(pending_signal_ != 0 ? 1.0 : 0.0);
  slots_.narrow(0, 1, 1).copy_(torch::isfinite(loss).logical_not().reshape({1}));
}

StepAgreement::Verdict StepAgreement::settle() {
  if (!direct_) staging_.copy_(slots_);
  Verdict v;
  if (flags_[0] > 0 || flags_[1] > 0) {                       // rare: which signal, which rank
    const bool finite = std::isfinite(loss_.item<double>());  // the step is over: no wait
    auto flags =
        torch::tensor({static_cast<int64_t>(pending_signal_), finite ? int64_t{0} : pg_.rank() + 1}, torch::kLong)
            .to(slots_.device());
    pg_.allreduce(flags, ReduceOp::kMax);
    flags = flags.cpu();
    v.stop_signal = static_cast<int>(flags[0].item<int64_t>());
    v.bad_rank = static_cast<int>(flags[1].item<int64_t>() - 1);
  }
  return v;
}

}  // namespace mpiddp::detail
