// Global-norm clipping (optim.hpp): the norm in float64, the factor by PyTorch's rule.
#include <mpiddp/compat.hpp>
#include <mpiddp/optim.hpp>

#include <torch/torch.h>

namespace mpiddp {

namespace {

std::vector<torch::Tensor> defined_grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

#if MPIDDP_HAS_FOREACH_CLIPPING
// On CUDA the whole model's gradients go through multi-tensor kernels (a few launches, not a few
// per parameter: 148 parameters cost GPT-2's step ~600 small kernels). The CPU keeps the per-tensor
// rule, which the CPU references pin bitwise.
bool multi_tensor(const std::vector<torch::Tensor>& grads) { return !grads.empty() && grads.front().is_cuda(); }
#endif

}  // namespace

torch::Tensor grad_squared_norm(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  const auto grads = defined_grads(params);
#if MPIDDP_HAS_FOREACH_CLIPPING
  if (multi_tensor(grads)) {
    // Each tensor's norm accumulated in float64 (its squares too: float64's, not float32's), then
    // their squares summed: the partition moves the result only at float64's precision, as below.
    return torch::stack(at::_foreach_norm(grads, 2, torch::kDouble)).pow(2).sum();
  }
#endif
  torch::Tensor sum;
  for (const auto& g : grads) {
    // Each element's square rounds alike wherever the element lies; the sum is float64's, so the
    // order of the additions (the partition) moves it only at float64's precision. No float64 copy.
    // float16/bfloat16 gradients are squared in float32 (a float16 above 256 would square to Inf).
    const bool reduced = g.scalar_type() == torch::kHalf || g.scalar_type() == torch::kBFloat16;
    auto squares = (reduced ? g.to(torch::kFloat) : g).pow(2).sum(torch::kDouble);
    sum = sum.defined() ? sum + squares : squares;
  }
  if (!sum.defined()) {
    const auto device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
    sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  }
  return sum;
}

double clip_grads_to(const std::vector<torch::Tensor>& params, double norm, double max_norm) {
  torch::NoGradGuard no_grad;
  const double factor = max_norm / (norm + 1e-6);  // torch::nn::utils::clip_grad_norm_'s rule
  if (factor < 1) {
    for (auto& g : defined_grads(params)) g.mul_(factor);
  }
  return norm;
}

torch::Tensor clip_grads_to(const std::vector<torch::Tensor>& params, const torch::Tensor& squared_norm,
                            double max_norm) {
  torch::NoGradGuard no_grad;
  const auto norm = squared_norm.sqrt();
  // float64 as the host's rule computes it, then float32, as a double scalar multiplies a tensor.
  auto factor = max_norm / (norm + 1e-6);
  factor = torch::where(factor < 1, factor, torch::ones_like(factor)).to(torch::kFloat);
  const auto grads = defined_grads(params);
#if MPIDDP_HAS_FOREACH_CLIPPING
  if (multi_tensor(grads)) {
    at::_foreach_mul_(grads, factor);
    return norm;
  }
#endif
  for (auto& g : grads) g.mul_(factor);
  return norm;
}

}  // namespace mpiddp
