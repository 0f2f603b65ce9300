// Adam and AdamW in one pass over each parameter on the CPU: what FusedAdam and FusedAdamW run for
// dense contiguous float32/float64 CPU tensors, in every libtorch (1.13 has no fused kernel; the
// fused CPU kernel of 2.4+ vectorises a tensor's body and not its tail, so an element's rounding
// would depend on where the tensor starts: ZeRO's shards cut parameters at other places than
// DDP's whole tensors, and must step each element exactly as they do).
//
// Per element, in torch::optim::Adam(W)::step's order: decay (AdamW: p * (1 - lr wd); Adam:
// g + wd p), the moments m = m b1 + (1 - b1) g and v = v b2 + (1 - b2) g g, amsgrad's running
// maximum, then p + (-lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps); every constant rounded to the
// tensor's type, each operation rounded once (this file is built without floating-point
// contraction), so the result is a function of the element's values alone.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace mpiddp::detail {

struct AdamConstants {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;  ///< AdamW's decay of the parameter, else Adam's L2 term in the gradient
  bool amsgrad = false;
};

/// Whether adam_cpu_step() takes these tensors: CPU, dense, contiguous, float32 or float64, alike.
bool adam_cpu_accepts(const torch::Tensor& param, const torch::Tensor& grad);

/// One step of the parameter `param` after `step` steps in all (counting this one); `max_exp_avg_sq`
/// only with amsgrad.
void adam_cpu_step(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                   const torch::Tensor& exp_avg_sq, const torch::Tensor& max_exp_avg_sq, int64_t step,
                   const AdamConstants& c);

}  // namespace mpiddp::detail
