// The built-in models: `mpiddp train --model NAME`, bench/, tests/ and examples/ use the same ones.
// One table (builtin_models()) says each model's name, what it trains on and how it is made from a
// training set's shape; make_model() reads it, or loads a TorchScript file for any other name.
#pragma once

#include <mpiddp/data.hpp>
#include <mpiddp/gpt.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/units.hpp>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mpiddp {
namespace models {

/// `fc` = Linear(in, out) on the flattened inputs (the seeds' Linear(20, 1)).
struct LinearNetImpl : torch::nn::Module {
  LinearNetImpl(int64_t in, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear fc;
};
TORCH_MODULE(LinearNet);

/// fc1 = Linear(in, 128), ReLU, fc2 = Linear(128, 64), ReLU, fc3 = Linear(64, out), on the flattened inputs.
/// ZeRO stage 3's units (units.hpp): each Linear.
struct MlpImpl : torch::nn::Module, UnitModule {
  MlpImpl(int64_t in, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  std::vector<std::shared_ptr<torch::nn::Module>> units() const override;
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

/// PyTorch's examples/mnist `Net` with its parameter names (conv1, conv2, fc1, fc2), returning
/// logits (the example's log_softmax + nll_loss is the cross-entropy the trainer applies), so its
/// state_dict loads into the Python class. Inputs [1, 28, 28], 10 classes. ZeRO stage 3's units
/// (units.hpp): each convolution and Linear.
struct MnistNetImpl : torch::nn::Module, UnitModule {
  MnistNetImpl();
  torch::Tensor forward(const torch::Tensor& input);
  std::vector<std::shared_ptr<torch::nn::Module>> units() const override;
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout dropout1, dropout2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(MnistNet);

}  // namespace models

/// One built-in model: its name, what it is, and how it is made for a training set.
struct BuiltinModel {
  std::string name;
  std::string summary;
  bool token_data = false;  ///< trains on token windows (else on an HDF5 set of fixed-size samples)
  /// The model for `data` (its inputs' shape, its classes or targets), `gpt` the GPT's shape,
  /// `init` whether its parameters are deferred (units.hpp; the GPT defers, the others, at most a few
  /// MB, are made whole); throws mpiddp::Error (one line) when the set does not suit it.
  std::function<std::shared_ptr<Model>(const DatasetInfo& data, const GptConfig& gpt, ParameterInit init)> make;
};

/// linear, mlp, cnn, gpt.
const std::vector<BuiltinModel>& builtin_models();

/// The built-in model named `spec` for `data`, or the TorchScript file `spec`; mpiddp::Error (one
/// line) for an unknown name, a missing file, or a set the model does not take.
std::shared_ptr<Model> make_model(const std::string& spec, const DatasetInfo& data, const GptConfig& gpt = {},
                                  ParameterInit init = ParameterInit::kNow);

}  // namespace mpiddp
