// FusedAdam / FusedAdamW against libtorch's own torch::optim::Adam / AdamW, the reference: the
// same gradients into both, step after step with the learning rate changed between steps as the
// Trainer's schedules do; parameters and every piece of state must agree within float rounding.
#include <gtest/gtest.h>
#include <mpiddp/compat.hpp>
#include <mpiddp/optim.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Case {
  std::string name;
  bool adamw;
  double weight_decay;
  bool amsgrad;
};

std::vector<torch::Tensor> make_params(c10::ScalarType second_dtype = torch::kFloat) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> p = {torch::randn({32, 1, 3, 3}), torch::randn({32}, second_dtype),
                                  torch::randn({128, 96}), torch::randn({10})};
  for (auto& t : p) t.requires_grad_(true);
  return p;
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& t : params) out.push_back(t.detach().clone().requires_grad_(true));
  return out;
}

template <class State>
void expect_same_state(const torch::optim::Optimizer& fused, const torch::optim::Optimizer& reference,
                       const std::vector<torch::Tensor>& fp, const std::vector<torch::Tensor>& rp, const Case& c) {
  const auto& fs = fused.state();
  const auto& rs = reference.state();
  ASSERT_EQ(fs.size(), rs.size()) << c.name;
  for (size_t i = 0; i < fp.size(); ++i) {
    const auto f_it = fs.find(mpiddp::compat::optimizer_state_key(fs, fp[i].unsafeGetTensorImpl()));
    const auto r_it = rs.find(mpiddp::compat::optimizer_state_key(rs, rp[i].unsafeGetTensorImpl()));
    ASSERT_EQ(f_it == fs.end(), r_it == rs.end()) << c.name << " parameter " << i;
    if (r_it == rs.end()) continue;
    const auto& f = static_cast<const State&>(*f_it->second);
    const auto& r = static_cast<const State&>(*r_it->second);
    EXPECT_EQ(f.step(), r.step()) << c.name;
    // The moments mix terms of order 1 (gradients ~ N(0, 1)): an element that cancels to near 0
    // keeps an absolute rounding error of a few float ulps of 1, whichever formula.
    EXPECT_TRUE(torch::allclose(f.exp_avg(), r.exp_avg(), 1e-5, 1e-6))
        << c.name << " exp_avg " << i << " differs by "
        << (f.exp_avg() - r.exp_avg()).abs().max().template item<double>();
    EXPECT_TRUE(torch::allclose(f.exp_avg_sq(), r.exp_avg_sq(), 1e-5, 1e-9)) << c.name << " exp_avg_sq " << i;
    EXPECT_EQ(f.max_exp_avg_sq().defined(), r.max_exp_avg_sq().defined()) << c.name;
    if (r.max_exp_avg_sq().defined()) {
      EXPECT_TRUE(torch::allclose(f.max_exp_avg_sq(), r.max_exp_avg_sq(), 1e-5, 1e-9)) << c.name << " max " << i;
    }
  }
}

// Runs `steps` steps of both optimizers with the same gradients (the last parameter gets none for
// the first three steps, so its state starts late, as a frozen-then-thawed layer's would).
// Returns how many steps of the fused optimizer ran the fused kernel.
template <class Fused, class Reference, class Options, class State>
int run_case(const Case& c, c10::ScalarType second_dtype, int steps) {
  auto fp = make_params(second_dtype);
  auto rp = copies(fp);
  const auto options = Options(1e-2).weight_decay(c.weight_decay).amsgrad(c.amsgrad);
  Fused fused(fp, options);
  Reference reference(rp, options);
  int fused_steps = 0;
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < fp.size(); ++i) {
      if (i + 1 == fp.size() && s < 3) continue;
      const auto g = torch::randn_like(fp[i]);
      fp[i].mutable_grad() = g.clone();
      rp[i].mutable_grad() = g.clone();
    }
    const double lr = 1e-2 * (1.0 + 0.5 * (s % 4));  // a schedule sets it between steps
    for (auto* opt : std::vector<torch::optim::Optimizer*>{&fused, &reference}) {
      for (auto& group : opt->param_groups()) group.options().set_lr(lr);
    }
    fused.step();
    reference.step();
    fused_steps += fused.last_step_fused() ? 1 : 0;
  }
  for (size_t i = 0; i < fp.size(); ++i) {
    EXPECT_TRUE(torch::allclose(fp[i], rp[i], 1e-5, 1e-6))
        << c.name << " parameter " << i << " differs by " << (fp[i] - rp[i]).abs().max().item<double>();
  }
  expect_same_state<State>(fused, reference, fp, rp, c);
  return fused_steps;
}

const std::vector<Case> kCases = {{"adam", false, 0.0, false},
                                  {"adam, weight decay", false, 0.01, false},
                                  {"adam, amsgrad", false, 0.0, true},
                                  {"adamw, weight decay", true, 0.05, false},
                                  {"adamw, amsgrad", true, 0.01, true}};

int run(const Case& c, c10::ScalarType second_dtype, int steps) {
  if (c.adamw) {
    return run_case<mpiddp::FusedAdamW, torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
        c, second_dtype, steps);
  }
  return run_case<mpiddp::FusedAdam, torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
      c, second_dtype, steps);
}

}  // namespace

TEST(FusedAdam, SameUpdateAndStateAsLibtorchsAdam) {
  for (const auto& c : kCases) {
    // On CPU float32 every step is mpiddp's one-pass loop (adam_cpu.hpp), in every libtorch.
    EXPECT_EQ(run(c, torch::kFloat, 25), 25) << c.name;
  }
}

// What ZeRO relies on: a parameter stepped as two pieces (views cut at an odd element, as shards
// cut it) ends bitwise where the whole tensor does, for every variant.
TEST(FusedAdam, PiecesStepBitwiseAsTheWhole) {
  for (const auto& c : kCases) {
    torch::manual_seed(3);
    auto whole = torch::randn({1001});
    auto flat = whole.clone();
    std::vector<torch::Tensor> pieces = {flat.narrow(0, 0, 333), flat.narrow(0, 333, 668)};
    auto options = torch::optim::AdamWOptions(1e-2).weight_decay(c.weight_decay).amsgrad(c.amsgrad);
    auto aoptions = torch::optim::AdamOptions(1e-2).weight_decay(c.weight_decay).amsgrad(c.amsgrad);
    std::unique_ptr<torch::optim::Optimizer> one, two;
    if (c.adamw) {
      one = std::make_unique<mpiddp::FusedAdamW>(std::vector<torch::Tensor>{whole}, options);
      two = std::make_unique<mpiddp::FusedAdamW>(pieces, options);
    } else {
      one = std::make_unique<mpiddp::FusedAdam>(std::vector<torch::Tensor>{whole}, aoptions);
      two = std::make_unique<mpiddp::FusedAdam>(pieces, aoptions);
    }
    for (int s = 0; s < 5; ++s) {
      auto g = torch::randn({1001});
      whole.mutable_grad() = g.clone();
      pieces[0].mutable_grad() = g.narrow(0, 0, 333).clone();
      pieces[1].mutable_grad() = g.narrow(0, 333, 668).clone();
      one->step();
      two->step();
    }
    EXPECT_TRUE(torch::equal(whole, flat)) << c.name << ": " << (whole - flat).abs().max().item<double>();
  }
}

TEST(FusedAdam, MixedDtypesTakeLibtorchsOwnStep) {
  for (const auto& c : kCases) EXPECT_EQ(run(c, torch::kDouble, 6), 0) << c.name;
}

TEST(FusedAdam, KernelFoundWhereLibtorchHasOne) {
  // The one expectation about the environment: libtorch 2.4 and later run both kernels on CPU, so
  // on such a libtorch (CI's Debian sid) the fast path must be the one taken.
  if (!MPIDDP_TORCH_VERSION_AT_LEAST(2, 4))
    GTEST_SKIP() << "libtorch " << mpiddp::compat::torch_version() << " has no CPU kernel";
  EXPECT_TRUE(mpiddp::fused_adam_runs(torch::kCPU, torch::kFloat, false));
  EXPECT_TRUE(mpiddp::fused_adam_runs(torch::kCPU, torch::kFloat, true));
  EXPECT_TRUE(mpiddp::fused_adam_runs(torch::kCPU, torch::kDouble, false));
}

// Global-norm clipping with the norm left on the device (the Trainer's, no host wait) is the host
// rule exactly: the same factor, the same scaled gradients bitwise; within the bound, and with a
// norm that is not finite, the gradients stay as they are (the host rule does not scale them).
namespace {
std::vector<torch::Tensor> parameters_with_gradients(double scale) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> params;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{33, 5}, {5}, {2, 3, 4}}) {
    auto p = torch::zeros(shape, torch::requires_grad());
    p.mutable_grad() = torch::randn(shape) * scale;
    params.push_back(p);
  }
  return params;
}
}  // namespace

TEST(Clipping, NormOnTheDeviceScalesAsTheHostRule) {
  for (const double scale : {0.001, 1.0, 50.0}) {
    auto host = parameters_with_gradients(scale), device = parameters_with_gradients(scale);
    const double norm = mpiddp::clip_grads_to(host, std::sqrt(mpiddp::grad_squared_norm(host).item<double>()), 1.0);
    const auto device_norm = mpiddp::clip_grads_to(device, mpiddp::grad_squared_norm(device), 1.0);
    EXPECT_EQ(device_norm.item<double>(), norm) << "scale " << scale;
    for (size_t i = 0; i < host.size(); ++i) {
      EXPECT_TRUE(torch::equal(host[i].grad(), device[i].grad())) << "scale " << scale << ", parameter " << i;
    }
  }
  auto params = parameters_with_gradients(1.0);
  const auto before = params[0].grad().clone();
  params[1].mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  mpiddp::clip_grads_to(params, mpiddp::grad_squared_norm(params), 1.0);
  EXPECT_TRUE(torch::equal(params[0].grad(), before)) << "a NaN norm must leave the gradients unscaled";
}

// The optimizer table's count of state tensors per element (the memory plan's) against what a step
// leaves: each optimizer made at its settings, stepped once, its state for a parameter counted.
TEST(OptimizerTable, StateTensorsAreWhatAStepLeaves) {
  struct Made {
    std::string what;
    std::function<std::shared_ptr<torch::optim::Optimizer>(const std::vector<torch::Tensor>&)> make;
  };
  namespace optim = torch::optim;
  const std::vector<Made> made = {
      {"sgd", [](const auto& p) { return std::make_shared<optim::SGD>(p, optim::SGDOptions(0.1)); }},
      {"sgd+momentum",
       [](const auto& p) { return std::make_shared<optim::SGD>(p, optim::SGDOptions(0.1).momentum(0.9)); }},
      {"adam", [](const auto& p) { return std::make_shared<optim::Adam>(p, optim::AdamOptions(0.1)); }},
      {"adam+amsgrad",
       [](const auto& p) { return std::make_shared<optim::Adam>(p, optim::AdamOptions(0.1).amsgrad(true)); }},
      {"adamw", [](const auto& p) { return std::make_shared<optim::AdamW>(p, optim::AdamWOptions(0.1)); }},
      {"adamw (fused)",
       [](const auto& p) {
         mpiddp::OptimizerSettings s;
         s.lr = 0.1;
         return mpiddp::find_optimizer("adamw")->make(p, s);
       }},
  };
  for (const auto& m : made) {
    auto params = make_params();
    auto opt = m.make(params);
    for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
    opt->step();
    const auto* spec = mpiddp::optimizer_spec_of(*opt);
    ASSERT_NE(spec, nullptr) << m.what;
    int held = 0;
    if (const auto* state = mpiddp::state_of(*opt, params[2])) {
      for (const auto& [name, t] : spec->fields_of(*state).tensors) held += t.numel() == params[2].numel() ? 1 : 0;
    }
    EXPECT_EQ(spec->state_tensors(*opt), held) << m.what;
  }
}
