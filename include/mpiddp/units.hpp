// Units: the parts of a model that ZeRO stage 3 gathers one at a time (FSDP's wrapped modules). A
// C++ module that implements UnitModule names its units (child modules, in the order its forward
// runs them) and runs each one's forward through run_unit(); under ZeRO stage 3 (zero.hpp) each
// rank then holds 1/N of the units' parameters, and a unit's parameters are gathered just before
// its forward and again before its backward. The built-in GPT (a unit per transformer block), MLP
// and CNN (a unit per layer) are UnitModules. Parameters outside every unit (the GPT's embeddings,
// its tied head and final LayerNorm; every parameter of a TorchScript module or of a module that is
// no UnitModule) stay whole on every rank, as at stage 2.
//
//   struct NetImpl : torch::nn::Module, mpiddp::UnitModule {
//     std::vector<std::shared_ptr<torch::nn::Module>> units() const override { return {fc1.ptr(), fc2.ptr()}; }
//     torch::Tensor forward(torch::Tensor x) {
//       x = run_unit(0, [this](const torch::Tensor& t) { return torch::relu(fc1(t)); }, x);
//       return run_unit(1, [this](const torch::Tensor& t) { return fc2(t); }, x);
//     }
//   };
//
// A unit's forward must read only its own parameters besides its input (and the parameters outside
// every unit), and each unit runs once per forward.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace mpiddp {

using UnitForward = std::function<torch::Tensor(const torch::Tensor&)>;

/// What runs around each unit's forward (ZeRO stage 3's gathering).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  /// Runs `forward(input)` as unit `unit`'s forward and returns its output.
  virtual torch::Tensor run(size_t unit, const UnitForward& forward, const torch::Tensor& input) = 0;
};

class UnitModule {
 public:
  virtual ~UnitModule() = default;
  /// The units, in the order forward runs them.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> units() const = 0;
  /// Every later forward runs its units through `hooks` (nullptr: plainly).
  void set_unit_hooks(UnitHooks* hooks) { hooks_ = hooks; }

 protected:
  torch::Tensor run_unit(size_t unit, const UnitForward& forward, const torch::Tensor& input) const {
    return hooks_ ? hooks_->run(unit, forward, input) : forward(input);
  }

 private:
  UnitHooks* hooks_ = nullptr;
};

}  // namespace mpiddp
