#include "app/models.hpp"

#include <mpiddp/error.hpp>

#include <filesystem>

#include "common/text.hpp"

namespace mpiddp::app {

namespace {

namespace nn = torch::nn;

torch::Tensor flat(const torch::Tensor& x) { return x.dim() > 2 ? x.flatten(1) : x; }

struct LinearNetImpl : nn::Module {
  LinearNetImpl(int64_t in, int64_t out) : fc(register_module("fc", nn::Linear(in, out))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(flat(x)); }
  nn::Linear fc;
};
TORCH_MODULE(LinearNet);

struct MlpImpl : nn::Module {
  MlpImpl(int64_t in, int64_t out)
      : fc1(register_module("fc1", nn::Linear(in, 128))), fc2(register_module("fc2", nn::Linear(128, 64))),
        fc3(register_module("fc3", nn::Linear(64, out))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(flat(x))))));
  }
  nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

// PyTorch's examples/mnist Net, returning logits (the example's log_softmax + nll_loss is the
// cross-entropy the trainer applies). Same names, so its state_dict loads into the Python class.
struct MnistNetImpl : nn::Module {
  MnistNetImpl()
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 32, 3)))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3)))),
        dropout1(register_module("dropout1", nn::Dropout(0.25))),
        dropout2(register_module("dropout2", nn::Dropout(0.5))),
        fc1(register_module("fc1", nn::Linear(9216, 128))),
        fc2(register_module("fc2", nn::Linear(128, 10))) {}
  torch::Tensor forward(const torch::Tensor& input) {
    auto x = torch::relu(conv1(input));
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    x = torch::relu(fc1(dropout1(x).flatten(1)));
    return fc2(dropout2(x));
  }
  nn::Conv2d conv1, conv2;
  nn::Dropout dropout1, dropout2;
  nn::Linear fc1, fc2;
};
TORCH_MODULE(MnistNet);

int64_t flat_size(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace

std::shared_ptr<Model> make_model(const std::string& spec, const DatasetInfo& data, const GptConfig& gpt) {
  if (spec == "gpt") {
    MPIDDP_CHECK(data.block_size > 0, "--model gpt trains on token data (llm.c shards); '" + data.path +
                                          "' is an HDF5 dataset");
    return wrap_module(Gpt(gpt), "gpt");
  }
  MPIDDP_CHECK(data.block_size == 0 || (spec != "linear" && spec != "mlp" && spec != "cnn"),
               "--model " + spec + " takes an HDF5 dataset; token data needs --model gpt or a TorchScript model");
  const int64_t in = flat_size(data.sample_shape);
  const int64_t out = data.classification ? data.num_classes : data.target_dim;
  if (spec == "linear") return wrap_module(LinearNet(in, out), "linear");
  if (spec == "mlp") return wrap_module(Mlp(in, out), "mlp");
  if (spec == "cnn") {
    MPIDDP_CHECK(data.sample_shape == std::vector<int64_t>({1, 28, 28}),
                 "--model cnn needs inputs of [1, 28, 28]; '" + data.path + "' has " + detail::shape_text(data.sample_shape));
    MPIDDP_CHECK(data.classification && data.num_classes == 10,
                 "--model cnn needs 10 classes; '" + data.path + "' has " +
                     (data.classification ? std::to_string(data.num_classes) + " classes" : "regression targets"));
    return wrap_module(MnistNet(), "cnn");
  }
  MPIDDP_CHECK(std::filesystem::exists(spec),
               "unknown --model '" + spec + "' (linear, mlp, cnn, gpt, or a TorchScript file: no such file)");
  return load_torchscript(spec);
}

}  // namespace mpiddp::app
