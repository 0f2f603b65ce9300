// Mixed precision: autocast for the forward pass, and dynamic loss scaling for float16.
//   bf16 (torch::kBFloat16): CPU and CUDA; the forward's matmuls and convolutions run in bfloat16,
//        parameters, gradients and the optimizer stay float32. No loss scaling is needed.
//   fp16 (torch::kHalf): CUDA (and CPU where libtorch has CPU kernels for it, 2.x); gradients
//        need loss scaling, which GradScaler does as torch.amp.GradScaler does, over the same
//        ATen operations (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_).
// The Trainer uses both (TrainerOptions::precision); a program with its own loop may too.
#pragma once

#include <mpiddp/process_group.hpp>

#include <torch/torch.h>

#include <vector>

namespace mpiddp {

/// Autocast on `device`'s type for this thread while it lives (as `with torch.autocast(...)`),
/// at `dtype` (kBFloat16 or kHalf; kFloat: does nothing). Restores the previous state; the last
/// guard to end clears autocast's cache of cast weights.
class Autocast {
 public:
  Autocast(c10::Device device, c10::ScalarType dtype);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_;
  bool active_ = false, was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::kFloat;
};

/// "fp32" | "bf16" | "fp16" <-> kFloat | kBFloat16 | kHalf; throws mpiddp::Error on anything else.
c10::ScalarType parse_precision(const std::string& name);
std::string precision_name(c10::ScalarType precision);

struct GradScalerOptions {
  double init_scale = 65536.0;  ///< 2^16, PyTorch's default
  double growth_factor = 2.0;   ///< x this after `growth_interval` steps in a row without Inf/NaN
  double backoff_factor = 0.5;  ///< x this on a step with Inf/NaN gradients (that step is skipped)
  int64_t growth_interval = 2000;
};

/// Throws mpiddp::Error (one line) on options GradScaler does not take, or where this libtorch
/// cannot scale on `device` (CPU kernels for the scaling operations came with libtorch 2.x): the
/// check GradScaler's constructor makes, for a caller that checks before it makes one.
void check_grad_scaler(c10::Device device, const GradScalerOptions& options);

/// Dynamic loss scaling: backward runs on loss x scale so that small float16 gradients do not
/// flush to zero; before the update the gradients are divided by the scale and checked. A step
/// with an Inf/NaN gradient on any rank is skipped by every rank (unscale() returns the verdict
/// of all ranks) and the scale backs off; after growth_interval good steps it grows.
class GradScaler {
 public:
  /// Throws as check_grad_scaler(device, options).
  GradScaler(c10::Device device, GradScalerOptions options = {});

  /// loss x scale, for backward.
  torch::Tensor scale(const torch::Tensor& loss) const;
  /// Divides the defined gradients of `params` by the scale in place and returns true when any
  /// of them held an Inf/NaN on any rank of `pg` (nullptr: this process alone), so the step
  /// must be skipped. Collective when pg is given: every rank calls it once per step.
  bool unscale(const std::vector<torch::Tensor>& params, ProcessGroup* pg);
  /// After each step, taken or skipped: backs off or grows the scale (ATen's _amp_update_scale_).
  void update();

  double scale_value() const;
  int64_t growth_tracker() const;
  /// Restores a saved state (snapshots).
  void load(double scale, int64_t growth_tracker);

 private:
  GradScalerOptions options_;
  torch::Tensor scale_, growth_tracker_, found_inf_;
};

}  // namespace mpiddp
