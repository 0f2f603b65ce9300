// A Sequential split into units by a wrap policy (include/mpiddp/units.hpp).
#include <mpiddp/error.hpp>
#include <mpiddp/units.hpp>

namespace mpiddp {

SequentialUnitsImpl::SequentialUnitsImpl(torch::nn::Sequential sequential, const WrapPolicy& policy)
    : sequential_(std::move(sequential)) {
  MPIDDP_CHECK(policy, "SequentialUnits needs a wrap policy");
  int units = 0;
  for (const auto& child : sequential_->named_children()) {
    register_module(child.key(), child.value());  // the Sequential's names, not nested under it
    unit_of_.push_back(policy(child.key(), *child.value()) ? units++ : -1);
  }
  MPIDDP_CHECK(units > 0, "the wrap policy picks none of the Sequential's " + std::to_string(unit_of_.size()) +
                              " children: there is no unit to shard");
}

torch::Tensor SequentialUnitsImpl::forward(const torch::Tensor& input) {
  torch::Tensor x = input;
  size_t i = 0;
  for (auto& child : *sequential_) {
    const int unit = unit_of_[i++];
    if (unit < 0) {
      x = child.forward(x);
      continue;
    }
    UnitForward step = [&child](const torch::Tensor& t) { return child.forward(t); };
    if (checkpointing_) {
      const auto params = child.ptr()->parameters();
      step = [step, params](const torch::Tensor& t) { return checkpoint(step, t, params); };
    }
    x = run_unit(static_cast<size_t>(unit), step, x);
  }
  return x;
}

std::vector<std::shared_ptr<torch::nn::Module>> SequentialUnitsImpl::units() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (size_t i = 0; i < unit_of_.size(); ++i) {
    if (unit_of_[i] >= 0) out.push_back(sequential_->ptr(i));
  }
  return out;
}

}  // namespace mpiddp
