// The built-in models and their table (models.hpp).
#include <mpiddp/error.hpp>
#include <mpiddp/models.hpp>

#include <filesystem>

#include "common/text.hpp"

namespace mpiddp {
namespace models {

namespace nn = torch::nn;

namespace {
torch::Tensor flat(const torch::Tensor& x) { return x.dim() > 2 ? x.flatten(1) : x; }
}  // namespace

LinearNetImpl::LinearNetImpl(int64_t in, int64_t out) : fc(register_module("fc", nn::Linear(in, out))) {}
torch::Tensor LinearNetImpl::forward(const torch::Tensor& x) { return fc(flat(x)); }

MlpImpl::MlpImpl(int64_t in, int64_t out)
    : fc1(register_module("fc1", nn::Linear(in, 128))),
      fc2(register_module("fc2", nn::Linear(128, 64))),
      fc3(register_module("fc3", nn::Linear(64, out))) {}
torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  auto h = run_unit(
      0, [this](const torch::Tensor& t) { return torch::relu(fc1(t)); }, flat(x));
  h = run_unit(
      1, [this](const torch::Tensor& t) { return torch::relu(fc2(t)); }, h);
  return run_unit(
      2, [this](const torch::Tensor& t) { return fc3(t); }, h);
}
std::vector<std::shared_ptr<nn::Module>> MlpImpl::units() const { return {fc1.ptr(), fc2.ptr(), fc3.ptr()}; }

MnistNetImpl::MnistNetImpl()
    : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 32, 3)))),
      conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3)))),
      dropout1(register_module("dropout1", nn::Dropout(0.25))),
      dropout2(register_module("dropout2", nn::Dropout(0.5))),
      fc1(register_module("fc1", nn::Linear(9216, 128))),
      fc2(register_module("fc2", nn::Linear(128, 10))) {}

torch::Tensor MnistNetImpl::forward(const torch::Tensor& input) {
  auto x = run_unit(
      0, [this](const torch::Tensor& t) { return torch::relu(conv1(t)); }, input);
  x = run_unit(
      1, [this](const torch::Tensor& t) { return torch::max_pool2d(torch::relu(conv2(t)), 2); }, x);
  x = run_unit(
      2, [this](const torch::Tensor& t) { return torch::relu(fc1(t)); }, dropout1(x).flatten(1));
  return run_unit(
      3, [this](const torch::Tensor& t) { return fc2(t); }, dropout2(x));
}
std::vector<std::shared_ptr<nn::Module>> MnistNetImpl::units() const {
  return {conv1.ptr(), conv2.ptr(), fc1.ptr(), fc2.ptr()};
}

}  // namespace models

namespace {

int64_t flat_size(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

int64_t outputs_of(const DatasetInfo& data) { return data.classification ? data.num_classes : data.target_dim; }

std::shared_ptr<Model> make_cnn(const DatasetInfo& data) {
  MPIDDP_CHECK(
      data.sample_shape == std::vector<int64_t>({1, 28, 28}),
      "--model cnn needs inputs of [1, 28, 28]; '" + data.path + "' has " + detail::shape_text(data.sample_shape));
  MPIDDP_CHECK(data.classification && data.num_classes == 10,
               "--model cnn needs 10 classes; '" + data.path + "' has " +
                   (data.classification ? std::to_string(data.num_classes) + " classes" : "regression targets"));
  return wrap_module(models::MnistNet(), "cnn");
}

}  // namespace

const std::vector<BuiltinModel>& builtin_models() {
  static const std::vector<BuiltinModel> table = {
      {"linear", "Linear(in, out) on the flattened inputs", false,
       [](const DatasetInfo& d, const GptConfig&, ParameterInit) {
         return wrap_module(models::LinearNet(flat_size(d.sample_shape), outputs_of(d)), "linear");
       }},
      {"mlp", "Linear(in, 128), ReLU, Linear(128, 64), ReLU, Linear(64, out)", false,
       [](const DatasetInfo& d, const GptConfig&, ParameterInit) {
         return wrap_module(models::Mlp(flat_size(d.sample_shape), outputs_of(d)), "mlp");
       }},
      {"cnn", "PyTorch's MNIST example CNN: inputs [1, 28, 28], 10 classes", false,
       [](const DatasetInfo& d, const GptConfig&, ParameterInit) { return make_cnn(d); }},
      {"gpt", "nanoGPT's GPT (--n-layer, --n-head, --n-embd, --block-size, --vocab-size)", true,
       [](const DatasetInfo&, const GptConfig& gpt, ParameterInit init) { return wrap_module(Gpt(gpt, init), "gpt"); }},
  };
  return table;
}

std::shared_ptr<Model> make_model(const std::string& spec, const DatasetInfo& data, const GptConfig& gpt,
                                  ParameterInit init) {
  for (const auto& m : builtin_models()) {
    if (m.name != spec) continue;
    const bool tokens = data.block_size > 0;
    MPIDDP_CHECK(
        tokens == m.token_data,
        m.token_data
            ? "--model " + spec + " trains on token data (llm.c shards); '" + data.path + "' is an HDF5 dataset"
            : "--model " + spec +
                  " takes an HDF5 dataset; token data needs --model gpt, a TorchScript model or a .pt2 program");
    return m.make(data, gpt, init);
  }
  std::string names;
  for (const auto& m : builtin_models()) names += m.name + ", ";
  MPIDDP_CHECK(std::filesystem::exists(spec),
               "unknown --model '" + spec + "' (" + names + "or a TorchScript or .pt2 file: no such file)");
  return load_model_file(spec);
}

}  // namespace mpiddp
