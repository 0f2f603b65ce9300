// Models the MPI tests share: small enough for 4 oversubscribed ranks, deterministic (no dropout:
// its randomness would differ between a sharded and a whole-batch run).
#pragma once

#include <mpiddp/units.hpp>

#include <torch/torch.h>

namespace mpiddp::testing {

/// PyTorch's MNIST example shape, smaller and without dropout: inputs [1, 28, 28], 10 classes.
/// ZeRO stage 3's units: the convolutions (fc outside every unit).
struct SmallCnnImpl : torch::nn::Module, mpiddp::UnitModule {
  SmallCnnImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 3)));
    fc = register_module("fc", torch::nn::Linear(8 * 5 * 5, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = run_unit(
        0, [this](const torch::Tensor& t) { return torch::max_pool2d(torch::relu(conv1(t)), 2); }, x);
    h = run_unit(
        1, [this](const torch::Tensor& t) { return torch::max_pool2d(torch::relu(conv2(t)), 2); }, h);
    return fc(h.flatten(1));
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() const override { return {conv1.ptr(), conv2.ptr()}; }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(SmallCnn);

}  // namespace mpiddp::testing
