// Autocast guard and the float16 gradient scaler (see include/mpiddp/precision.hpp).
#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/precision.hpp>

#include "common/text.hpp"

namespace mpiddp {

Autocast::Autocast(c10::Device device, c10::ScalarType dtype) : device_(device.type()) {
  if (dtype == c10::kFloat) return;
  active_ = true;
  was_enabled_ = compat::autocast_enabled(device_);
  was_dtype_ = compat::autocast_dtype(device_);
  compat::set_autocast(device_, true, dtype);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast(device_, was_enabled_, was_dtype_);
}

c10::ScalarType parse_precision(const std::string& name) {
  if (name == "fp32") return c10::kFloat;
  if (name == "bf16") return c10::kBFloat16;
  if (name == "fp16") return c10::kHalf;
  MPIDDP_THROW("unknown precision '" + name + "' (fp32, bf16, fp16)");
}

std::string precision_name(c10::ScalarType precision) {
  if (precision == c10::kFloat) return "fp32";
  if (precision == c10::kBFloat16) return "bf16";
  if (precision == c10::kHalf) return "fp16";
  return c10::toString(precision);
}

void check_grad_scaler(c10::Device device, const GradScalerOptions& options) {
  MPIDDP_CHECK(
      options.init_scale > 0 && options.growth_factor > 1 && options.backoff_factor > 0 && options.backoff_factor < 1 &&
          options.growth_interval > 0,
      "GradScalerOptions: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0");
  // Both operations on a scratch state: a libtorch without kernels for this device fails here,
  // with its reason, rather than at the first step.
  const auto f = torch::TensorOptions().dtype(torch::kFloat).device(device);
  auto s = torch::full({1}, options.init_scale, f), g = torch::zeros({1}, f.dtype(torch::kInt)),
       inf = torch::zeros({1}, f);
  try {
    std::vector<torch::Tensor> probe{torch::ones({2}, f)};
    at::_amp_foreach_non_finite_check_and_unscale_(probe, inf, s.reciprocal());
    at::_amp_update_scale_(s, g, inf, options.growth_factor, options.backoff_factor, options.growth_interval);
  } catch (const std::exception& e) {
    const std::string why = detail::first_line(e.what());
    MPIDDP_THROW("fp16 loss scaling is not available on " + device.str() + " with libtorch " + compat::torch_version() +
                 ": " +
                 (why.find("Could not run") != std::string::npos
                      ? "it has no " + device.str() +
                            " kernels for ATen's _amp_ operations (CPU ones came with libtorch 2.x); "
                            "on CPU use bf16"
                      : why.substr(0, 200)));
  }
}

GradScaler::GradScaler(c10::Device device, GradScalerOptions options) : options_(options) {
  check_grad_scaler(device, options_);
  const auto f = torch::TensorOptions().dtype(torch::kFloat).device(device);
  scale_ = torch::full({1}, options_.init_scale, f);
  growth_tracker_ = torch::zeros({1}, f.dtype(torch::kInt));
  found_inf_ = torch::zeros({1}, f);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const { return loss * scale_.to(loss.scalar_type()); }

bool GradScaler::unscale(const std::vector<torch::Tensor>& params, ProcessGroup* pg) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  found_inf_.zero_();
  // The reciprocal in double, as PyTorch does, then float32 for the kernel.
  const auto inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  if (!grads.empty()) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv_scale);
  if (pg != nullptr) pg->allreduce(found_inf_, ReduceOp::kMax);
  return found_inf_.item<float>() != 0.0f;
}

void GradScaler::update() {
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
}

double GradScaler::scale_value() const { return scale_.item<double>(); }
int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

void GradScaler::load(double scale, int64_t growth_tracker) {
  scale_.fill_(scale);
  growth_tracker_.fill_(growth_tracker);
}

}  // namespace mpiddp
