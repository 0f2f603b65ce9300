// Adam and AdamW whose step runs libtorch's fused multi-tensor kernel where the linked libtorch has
// one: the same options, the same per-parameter state (so the same snapshots) and the same update
// as torch::optim::Adam / AdamW, in one pass over each parameter instead of about eight.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mpiddp {

/// Whether libtorch's fused Adam (`adamw` false) or AdamW (true) kernel runs on tensors of this
/// device and dtype in the linked libtorch: found out once per combination by running it on a
/// one-element tensor (CPU has one from libtorch 2.4, CUDA from 1.13 for Adam and 2.0 for AdamW).
bool fused_adam_runs(c10::Device device, c10::ScalarType dtype, bool adamw);

/// torch::optim::Adam with a faster step (`mpiddp train --optimizer adam` uses it). Where every
/// parameter that has a gradient is dense, on one device and of one dtype that fused_adam_runs()
/// accepts, step() is one call of aten::_fused_adam_ over all of them; otherwise it is Adam's own.
/// Not bitwise the per-tensor arithmetic of torch::optim::Adam (the kernel orders its float
/// operations its own way), equal to it within float rounding.
class FusedAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Whether the last step() ran the fused kernel.
  bool last_step_fused() const { return last_step_fused_; }

 private:
  bool last_step_fused_ = false;
};

/// torch::optim::AdamW (decoupled weight decay) with the step of FusedAdam (aten::_fused_adamw_),
/// where the linked libtorch declares that kernel; `mpiddp train --optimizer adamw` uses it.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
  bool last_step_fused() const { return last_step_fused_; }

 private:
  bool last_step_fused_ = false;
};

/// The optimizers whose per-parameter state mpiddp reads and writes tensor by tensor (snapshots,
/// ZeRO's shards); kOther for any other.
enum class OptimizerKind { kSgd, kAdam, kAdamW, kOther };
OptimizerKind optimizer_kind_of(const torch::optim::Optimizer& opt);

/// The state `opt` holds for parameter `p` (nullptr: none yet).
const torch::optim::OptimizerParamState* state_of(const torch::optim::Optimizer& opt, const torch::Tensor& p);

/// One parameter's optimizer state as named tensors: SGD's "momentum_buffer"; Adam's and AdamW's
/// "exp_avg", "exp_avg_sq" and (amsgrad) "max_exp_avg_sq", with their step count. Undefined tensors
/// are left out.
struct ParamStateFields {
  int64_t step = 0;  ///< Adam/AdamW only
  std::map<std::string, torch::Tensor> tensors;
};
ParamStateFields state_fields(OptimizerKind kind, const torch::optim::OptimizerParamState& state);
/// The names state_fields() may give for `kind`.
std::vector<std::string> state_field_names(OptimizerKind kind);
/// The state of `kind` holding `fields` (the inverse of state_fields). Not for kOther.
std::unique_ptr<torch::optim::OptimizerParamState> state_from_fields(OptimizerKind kind, const ParamStateFields& fields);

}  // namespace mpiddp
