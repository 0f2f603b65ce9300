// Adam and AdamW whose step runs libtorch's fused multi-tensor kernel where the linked libtorch has
// one: the same options, the same per-parameter state (so the same snapshots) and the same update
// as torch::optim::Adam / AdamW, in one pass over each parameter instead of about eight.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
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

/// The state `opt` holds for parameter `p` (nullptr: none yet).
const torch::optim::OptimizerParamState* state_of(const torch::optim::Optimizer& opt, const torch::Tensor& p);

/// One parameter's optimizer state as named tensors: SGD's "momentum_buffer"; Adam's and AdamW's
/// "exp_avg", "exp_avg_sq" and (amsgrad) "max_exp_avg_sq", with their step count. Undefined tensors
/// are left out.
struct ParamStateFields {
  int64_t step = 0;  ///< OptimizerSpec::counts_steps only
  std::map<std::string, torch::Tensor> tensors;
};

/// The hyperparameters `mpiddp train` gives an optimizer.
struct OptimizerSettings {
  double lr = 0;
  double momentum = 0;
  double weight_decay = 0;
  std::tuple<double, double> betas{0.9, 0.999};
  /// nanoGPT's groups: only tensors of two or more dimensions decay (biases, norms do not).
  bool decay_matrices_only = false;
};

/// The optimizers mpiddp knows, described once: the CLI builds them by name, snapshots store their
/// state tensor by tensor (any world size, any ZeRO stage), ZeRO shards them. Another optimizer
/// trains through the library, snapshotted as libtorch's own archive, and cannot be sharded.
struct OptimizerSpec {
  std::string name;                         ///< sgd | adam | adamw
  double default_lr = 0;                    ///< `mpiddp train --lr auto`
  std::vector<std::string> cli_parameters;  ///< `mpiddp train` flags it reads besides --lr
  std::vector<std::string> state_fields;    ///< the per-parameter tensors its state may hold
  bool counts_steps = false;                ///< a step count per parameter (Adam's bias correction)
  /// The state tensors per parameter element `opt` keeps at its settings (its first group's): Adam's
  /// and AdamW's 2 (AMSGrad 3), SGD's 1 with momentum, else 0. The memory plan counts by it.
  std::function<int(const torch::optim::Optimizer& opt)> state_tensors;
  /// Whether `opt` is one (mpiddp's fused forms included).
  std::function<bool(const torch::optim::Optimizer& opt)> is;
  std::function<ParamStateFields(const torch::optim::OptimizerParamState&)> fields_of;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const ParamStateFields&)> state_from;
  /// One of the same type with `like`'s defaults over `groups` (ZeRO's shards).
  std::function<std::unique_ptr<torch::optim::Optimizer>(const torch::optim::Optimizer& like,
                                                         std::vector<torch::optim::OptimizerParamGroup> groups)>
      same_kind_over;
  /// `mpiddp train`'s optimizer over `params` (each tensor once), fused where the kind has a fused form.
  std::function<std::shared_ptr<torch::optim::Optimizer>(const std::vector<torch::Tensor>& params,
                                                         const OptimizerSettings& settings)>
      make;
};

/// sgd, adam, adamw.
const std::vector<OptimizerSpec>& optimizers();
/// The row named `name`, or nullptr.
const OptimizerSpec* find_optimizer(const std::string& name);
/// The row `opt` is one of, or nullptr (an optimizer mpiddp neither shards nor stores field by field).
const OptimizerSpec* optimizer_spec_of(const torch::optim::Optimizer& opt);

/// Global-norm clipping, one rule for DDP's whole gradients and ZeRO's shards: the squared L2 norm
/// of the gradients of `params` (those with one), accumulated in float64 as a 0-dim tensor on their
/// device, so that any partition of the same elements (shards summed over the ranks) gives the same
/// norm to float64 rounding. On the CPU each element is squared in its own type (float32); on CUDA
/// (libtorch 2.4+) in float64 by multi-tensor kernels, so CPU and GPU norms differ at float32's
/// rounding of the squares.
torch::Tensor grad_squared_norm(const std::vector<torch::Tensor>& params);
/// Scales the gradients of `params` so that a global norm `norm` becomes at most `max_norm`, by
/// torch.nn.utils.clip_grad_norm_'s rule (factor max_norm / (norm + 1e-6) when below 1); returns `norm`.
double clip_grads_to(const std::vector<torch::Tensor>& params, double norm, double max_norm);
/// The same rule with the squared norm where grad_squared_norm leaves it (on the gradients'
/// device): the factor is computed there too, so the host does not wait for the gradients. Every
/// gradient is multiplied, by exactly 1 where the norm is within the bound or not finite (the same
/// values as not scaling it). Returns the norm, on the device.
torch::Tensor clip_grads_to(const std::vector<torch::Tensor>& params, const torch::Tensor& squared_norm,
                            double max_norm);

}  // namespace mpiddp
