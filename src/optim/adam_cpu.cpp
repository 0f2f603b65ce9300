#include "optim/adam_cpu.hpp"

#include <ATen/Parallel.h>

#include <cmath>

namespace mpiddp::detail {

namespace {

// The element loop, one instantiation per branch so that each vectorises (no branch inside, no
// aliasing between the five arrays).
template <typename T, bool kDecays, bool kL2, bool kAmsgrad>
void adam_elements(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, T* __restrict vmax,
                   int64_t begin, int64_t end, const AdamConstants& c, int64_t step) {
  const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(step));
  const T decay = static_cast<T>(1 - c.lr * c.weight_decay), l2 = static_cast<T>(c.weight_decay);
  const T b1 = static_cast<T>(c.beta1), one_minus_b1 = static_cast<T>(1 - c.beta1);
  const T b2 = static_cast<T>(c.beta2), one_minus_b2 = static_cast<T>(1 - c.beta2);
  const T bc2_sqrt = static_cast<T>(std::sqrt(bc2)), eps = static_cast<T>(c.eps);
  const T minus_step_size = static_cast<T>(-c.lr / bc1);
  for (int64_t i = begin; i < end; ++i) {
    T grad = g[i];
    T param = p[i];
    if constexpr (kDecays) param = param * decay;
    if constexpr (kL2) grad = grad + l2 * param;
    const T first = m[i] * b1 + one_minus_b1 * grad;
    T second = v[i] * b2 + one_minus_b2 * grad * grad;
    m[i] = first;
    v[i] = second;
    if constexpr (kAmsgrad) {
      second = vmax[i] > second ? vmax[i] : second;
      vmax[i] = second;
    }
    p[i] = param + minus_step_size * first / (std::sqrt(second) / bc2_sqrt + eps);
  }
}

template <typename T>
void adam_range(T* p, const T* g, T* m, T* v, T* vmax, int64_t begin, int64_t end, const AdamConstants& c,
                int64_t step) {
  const bool decays = c.decoupled && c.weight_decay != 0, l2 = !c.decoupled && c.weight_decay != 0;
  if (c.amsgrad) {
    if (decays) return adam_elements<T, true, false, true>(p, g, m, v, vmax, begin, end, c, step);
    if (l2) return adam_elements<T, false, true, true>(p, g, m, v, vmax, begin, end, c, step);
    return adam_elements<T, false, false, true>(p, g, m, v, vmax, begin, end, c, step);
  }
  if (decays) return adam_elements<T, true, false, false>(p, g, m, v, vmax, begin, end, c, step);
  if (l2) return adam_elements<T, false, true, false>(p, g, m, v, vmax, begin, end, c, step);
  adam_elements<T, false, false, false>(p, g, m, v, vmax, begin, end, c, step);
}

}  // namespace

bool adam_cpu_accepts(const torch::Tensor& param, const torch::Tensor& grad) {
  const auto t = param.scalar_type();
  return param.is_cpu() && grad.is_cpu() && !param.is_sparse() && !grad.is_sparse() &&
         (t == torch::kFloat || t == torch::kDouble) && grad.scalar_type() == t && param.is_contiguous() &&
         grad.is_contiguous() && param.numel() == grad.numel();
}

void adam_cpu_step(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                   const torch::Tensor& exp_avg_sq, const torch::Tensor& max_exp_avg_sq, int64_t step,
                   const AdamConstants& c) {
  AT_DISPATCH_FLOATING_TYPES(param.scalar_type(), "mpiddp_adam_cpu", [&] {
    auto* p = param.data_ptr<scalar_t>();
    const auto* g = grad.data_ptr<scalar_t>();
    auto* m = exp_avg.data_ptr<scalar_t>();
    auto* v = exp_avg_sq.data_ptr<scalar_t>();
    auto* vmax = c.amsgrad ? max_exp_avg_sq.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, param.numel(), 1 << 15,
                     [&](int64_t begin, int64_t end) { adam_range(p, g, m, v, vmax, begin, end, c, step); });
  });
}

}  // namespace mpiddp::detail
