#include "train/forward_loss.hpp"

#include <mpiddp/error.hpp>
#include <mpiddp/precision.hpp>

#include "common/text.hpp"

namespace mpiddp::detail {

namespace {
// Under autocast (bf16, fp16) the loss and whoever reads the outputs still see float32.
torch::Tensor float_after_autocast(const torch::Tensor& t, c10::ScalarType precision) {
  return precision != c10::kFloat && t.is_floating_point() && t.scalar_type() != c10::kFloat ? t.to(c10::kFloat) : t;
}
}  // namespace

torch::Tensor ForwardLoss::forward(const torch::Tensor& inputs) const {
  torch::Tensor out;
  {
    Autocast autocast(options_.device, options_.precision);
    out = model_.forward(inputs);
  }
  return float_after_autocast(out, options_.precision);
}

std::pair<torch::Tensor, torch::Tensor> ForwardLoss::operator()(const torch::Tensor& inputs,
                                                                const torch::Tensor& targets) const {
  if (!options_.model_loss) {
    auto out = forward(inputs);
    return {out, options_.loss(out, targets)};
  }
  std::pair<torch::Tensor, torch::Tensor> out;
  {
    Autocast autocast(options_.device, options_.precision);
    out = model_.forward_with_loss(inputs, targets);
  }
  MPIDDP_CHECK(out.second.numel() == 1, "the model's own loss must be a scalar, got " + shape_text(out.second.sizes()));
  return {float_after_autocast(out.first, options_.precision), float_after_autocast(out.second, options_.precision)};
}

}  // namespace mpiddp::detail
