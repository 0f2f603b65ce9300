// Units: the parts of a model that ZeRO stage 3 gathers one at a time (FSDP's wrapped modules). A
// C++ module that implements UnitModule names its units (modules, usually its children, in the order
// its forward runs them) and runs each one's forward through run_unit(); under ZeRO stage 3 (zero.hpp) each
// rank then holds 1/N of the units' parameters, and a unit's parameters are gathered just before
// its forward and again before its backward. The built-in GPT (its embeddings, each transformer
// block, its head), MLP and CNN (a unit per layer) are UnitModules. Parameters outside every unit
// (every parameter of a TorchScript module or of a module that is no UnitModule) stay whole on every
// rank, as at stage 2.
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
// every unit), or name the units whose parameters it also reads (a tied weight: the GPT's head reads
// the token embedding, which is the embeddings unit's, as run_unit(last, head, x, {0})); each unit
// runs once per forward.
//
// A model built as a torch::nn::Sequential needs no code of its own: SequentialUnits takes it with
// a wrap policy (FSDP's auto-wrap policy) that picks the children that are units:
//
//   auto net = mpiddp::SequentialUnits(torch::nn::Sequential(...), mpiddp::wrap_type<torch::nn::LinearImpl>());
//   auto model = mpiddp::wrap_module(net);
//
// (libtorch's modules have no forward hooks: a module that calls its children itself cannot be split
// from outside, and implements UnitModule instead.)
#pragma once

#include <mpiddp/checkpoint.hpp>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mpiddp {

using UnitForward = std::function<torch::Tensor(const torch::Tensor&)>;

/// What runs around each unit's forward (ZeRO stage 3's gathering).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  /// Runs `forward(input)` as unit `unit`'s forward, which also reads the parameters of the units
  /// `borrowed` (a weight tied to theirs), and returns its output.
  virtual torch::Tensor run(size_t unit, const UnitForward& forward, const torch::Tensor& input,
                            const std::vector<size_t>& borrowed) = 0;
};

class UnitModule {
 public:
  virtual ~UnitModule() = default;
  /// Deferred initialisation (below): writes the initial values of unit `unit`'s parameters, which
  /// have memory now, drawing from the CPU generator (so that the values do not depend on the
  /// device); called for the units in order. The default throws mpiddp::Error: a module that never
  /// defers its parameters needs none.
  virtual void init_unit(size_t unit);
  /// The units, in the order forward runs them. A unit may be a module that is no child of the
  /// model, grouping children of its (the GPT's embeddings unit holds transformer.wte and .wpe):
  /// only its parameters count.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> units() const = 0;
  /// Every later forward runs its units through `hooks` (nullptr: plainly).
  void set_unit_hooks(UnitHooks* hooks) { hooks_ = hooks; }

 protected:
  /// `borrowed`: the units whose parameters `forward` reads besides unit `unit`'s (a tied weight).
  torch::Tensor run_unit(size_t unit, const UnitForward& forward, const torch::Tensor& input,
                         const std::vector<size_t>& borrowed = {}) const {
    return hooks_ ? hooks_->run(unit, forward, input, borrowed) : forward(input);
  }

 private:
  UnitHooks* hooks_ = nullptr;
};

// Deferred initialisation (FSDP2's meta-device construction, DeepSpeed's zero.Init): a module may
// make its units' parameters "deferred", with their shape, dtype and device but no memory, so that
// the whole model never exists on one rank. ZeRO stage 3 gives the units memory one at a time, in
// order: each writes its initial values (init_unit), rank 0's are broadcast, each rank keeps its
// slice and the rest is freed. Anywhere else materialise_units() gives every unit its memory and
// values first (the same values: the same draws in the same order). The built-in GPT defers when
// asked (GptImpl's ParameterInit); nothing may read a deferred parameter.

/// How a module that can defer its parameters makes them: with their initial values now, or deferred.
enum class ParameterInit { kNow, kDeferred };
/// A deferred tensor of that shape and those options (no memory).
torch::Tensor deferred_tensor(c10::IntArrayRef sizes, const torch::TensorOptions& options);
/// Frees `t`'s memory, keeping its shape, dtype and device: `t` (and every view of it) is deferred.
void defer(const torch::Tensor& t);
/// Whether `t` has elements but no memory.
bool is_deferred(const torch::Tensor& t);
/// Gives unit `unit`'s deferred parameters memory (each on its device) and their initial values
/// (`module.init_unit(unit)`); nothing where none is deferred.
void materialise_unit(UnitModule& module, size_t unit);
/// materialise_unit() for every unit, in order; throws mpiddp::Error (one line) when a deferred
/// parameter is in no unit.
void materialise_units(torch::nn::Module& module);

/// Whether a child becomes a unit, given its name among its parent's children ("0", "1", ... in a
/// Sequential) and the child itself.
using WrapPolicy = std::function<bool(const std::string& name, const torch::nn::Module& child)>;

/// The policy that makes every child of type Impl a unit (torch::nn::LinearImpl, a block of yours).
template <class Impl>
WrapPolicy wrap_type() {
  return [](const std::string& /*name*/, const torch::nn::Module& child) {
    return dynamic_cast<const Impl*>(&child) != nullptr;
  };
}

/// A torch::nn::Sequential whose children the policy picks are units, in order; the others run as
/// they are, their parameters outside every unit. Its parameters keep the Sequential's names
/// ("0.weight", ...: PyTorch's nn.Sequential's). With activation checkpointing each unit's forward
/// is checkpointed.
class SequentialUnitsImpl : public torch::nn::Module, public UnitModule, public Checkpointable {
 public:
  /// Throws mpiddp::Error (one line) when the policy picks none of the children.
  SequentialUnitsImpl(torch::nn::Sequential sequential, const WrapPolicy& policy);
  torch::Tensor forward(const torch::Tensor& input);
  std::vector<std::shared_ptr<torch::nn::Module>> units() const override;
  void set_activation_checkpointing(bool on) override { checkpointing_ = on; }
  bool activation_checkpointing() const override { return checkpointing_; }

 private:
  torch::nn::Sequential sequential_;
  std::vector<int> unit_of_;  ///< each child's unit, -1: none
  bool checkpointing_ = false;
};
TORCH_MODULE(SequentialUnits);

}  // namespace mpiddp
