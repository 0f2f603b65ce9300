#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/optim.hpp>

#include "optim/adam_cpu.hpp"

#include <ATen/ATen.h>
#if MPIDDP_HAS_FUSED_ADAM
#include <ATen/ops/_fused_adam.h>
#endif
#if MPIDDP_HAS_FUSED_ADAMW
#include <ATen/ops/_fused_adamw.h>
#endif

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace mpiddp {

namespace {

// The tensors of one fused call: every parameter of a group that has a gradient.
struct FusedLists {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

// Runs the fused kernel of Adam (adamw false) or AdamW on `l`; false where this libtorch declares none.
bool run_fused(FusedLists& l, double lr, double beta1, double beta2, double weight_decay, double eps, bool amsgrad,
               bool adamw) {
  if (!adamw) {
#if MPIDDP_HAS_FUSED_ADAM
    at::_fused_adam_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps, lr, beta1, beta2,
                     weight_decay, eps, amsgrad, /*maximize=*/false);
    return true;
#endif
  } else {
#if MPIDDP_HAS_FUSED_ADAMW
    at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps, lr, beta1, beta2,
                      weight_decay, eps, amsgrad, /*maximize=*/false);
    return true;
#endif
  }
  (void)l, (void)lr, (void)beta1, (void)beta2, (void)weight_decay, (void)eps, (void)amsgrad;
  return false;
}

torch::Tensor step_tensor(int64_t step, const torch::Tensor& like) {
  return torch::full({}, static_cast<double>(step), like.options().dtype(torch::kFloat));
}

// One fused step over every group of `opt` (Adam or AdamW: Options, State), creating each
// parameter's state as their own step() does: on the CPU mpiddp's one-pass loop (adam_cpu.hpp),
// elsewhere libtorch's fused kernel. False, with nothing changed, where some parameter with a
// gradient rules both out: the caller then runs the optimizer's own step.
template <class Options, class State, class StateMap>
bool fused_step(std::vector<torch::optim::OptimizerParamGroup>& groups, StateMap& state, bool adamw) {
  c10::optional<c10::Device> device;
  c10::optional<c10::ScalarType> dtype;
  bool cpu_loop = true;
  for (auto& group : groups) {
    for (auto& p : group.params()) {
      const auto& g = p.grad();
      if (!g.defined()) continue;
      if (g.is_sparse() || p.is_sparse() || g.scalar_type() != p.scalar_type() || g.device() != p.device())
        return false;
      if (device && (*device != p.device() || *dtype != p.scalar_type())) return false;
      device = p.device();
      dtype = p.scalar_type();
      cpu_loop = cpu_loop && detail::adam_cpu_accepts(p, g);
    }
  }
  if (!device || (!cpu_loop && !fused_adam_runs(*device, *dtype, adamw))) return false;
  torch::NoGradGuard no_grad;
  for (auto& group : groups) {
    const auto& o = static_cast<const Options&>(group.options());
    FusedLists l;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state[compat::optimizer_state_key(state, p.unsafeGetTensorImpl())];
      if (!slot) {  // as torch::optim::Adam(W)::step creates it
        auto s = std::make_unique<State>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<State&>(*slot);
      s.step(s.step() + 1);
      if (cpu_loop) {
        if (!s.exp_avg().is_contiguous()) s.exp_avg(s.exp_avg().contiguous());
        if (!s.exp_avg_sq().is_contiguous()) s.exp_avg_sq(s.exp_avg_sq().contiguous());
        if (o.amsgrad() && !s.max_exp_avg_sq().is_contiguous()) s.max_exp_avg_sq(s.max_exp_avg_sq().contiguous());
        detail::AdamConstants c;
        c.lr = o.lr();
        std::tie(c.beta1, c.beta2) = o.betas();
        c.eps = o.eps();
        c.weight_decay = o.weight_decay();
        c.decoupled = adamw;
        c.amsgrad = o.amsgrad();
        detail::adam_cpu_step(p, p.grad(), s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq(), s.step(), c);
        continue;
      }
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(s.exp_avg());
      l.exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) l.max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
      l.steps.push_back(step_tensor(s.step(), p));
    }
    if (l.params.empty()) continue;
    run_fused(l, o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(), o.amsgrad(), adamw);
  }
  return true;
}

}  // namespace

bool fused_adam_runs(c10::Device device, c10::ScalarType dtype, bool adamw) {
  static std::mutex mutex;
  static std::map<std::tuple<c10::DeviceType, c10::DeviceIndex, c10::ScalarType, bool>, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device.type(), device.index(), dtype, adamw);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  bool runs = false;
  try {
    torch::NoGradGuard no_grad;
    const auto options = torch::TensorOptions().device(device).dtype(dtype);
    FusedLists l;
    l.params = {torch::ones({4}, options)};
    l.grads = {torch::ones({4}, options)};
    l.exp_avgs = {torch::zeros({4}, options)};
    l.exp_avg_sqs = {torch::zeros({4}, options)};
    l.steps = {step_tensor(1, l.params[0])};
    // One step of lr 0.5 from 1 with gradient 1 lands at 0.5 (bias-corrected moments are exactly 1).
    runs = run_fused(l, 0.5, 0.9, 0.999, 0.0, 0.0, false, adamw) &&
           l.params[0].to(torch::kCPU, torch::kFloat).sub(0.5).abs().max().item<double>() < 1e-2;
  } catch (const std::exception&) {  // no kernel for this device or dtype in this libtorch
    runs = false;
  }
  known[key] = runs;
  return runs;
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  last_step_fused_ = fused_step<torch::optim::AdamOptions, torch::optim::AdamParamState>(param_groups_, state_, false);
  if (!last_step_fused_) torch::optim::Adam::step();
  return loss;
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  last_step_fused_ = fused_step<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(param_groups_, state_, true);
  if (!last_step_fused_) torch::optim::AdamW::step();
  return loss;
}

const torch::optim::OptimizerParamState* state_of(const torch::optim::Optimizer& opt, const torch::Tensor& p) {
  const auto& state = opt.state();
  const auto it = state.find(compat::optimizer_state_key(state, p.unsafeGetTensorImpl()));
  return it == state.end() ? nullptr : it->second.get();
}

}  // namespace mpiddp
