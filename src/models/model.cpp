#include <mpiddp/checkpoint.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/units.hpp>

#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "common/distinct.hpp"
#include "common/text.hpp"

namespace mpiddp {

using detail::ends_with;
using detail::first_line;
using detail::shape_text;

namespace {

class ModuleModel final : public Model {
 public:
  ModuleModel(std::shared_ptr<torch::nn::Module> module, std::function<torch::Tensor(const torch::Tensor&)> forward,
              std::string name)
      : module_(std::move(module)), forward_(std::move(forward)), name_(std::move(name)) {}
  torch::Tensor forward(const torch::Tensor& input) override { return forward_(input); }
  NamedTensors named_parameters() const override { return named(module_->named_parameters(true)); }
  NamedTensors named_buffers() const override { return named(module_->named_buffers(true)); }
  void train(bool on) override { module_->train(on); }
  void to(c10::Device device) override {
    // A deferred parameter has no bytes to move: it is made again, deferred, on `device`.
    for (auto& p : module_->parameters(/*recurse=*/true)) {
      if (is_deferred(p) && p.device() != device) p.set_data(deferred_tensor(p.sizes(), p.options().device(device)));
    }
    module_->to(device);
  }
  std::string description() const override { return name_.empty() ? module_->name() : name_; }
  std::shared_ptr<torch::nn::Module> module() const override { return module_; }
  void set_activation_checkpointing(bool on) override {
    if (auto* blocks = dynamic_cast<Checkpointable*>(module_.get())) {
      blocks->set_activation_checkpointing(on);
      return;
    }
    Model::set_activation_checkpointing(on);
  }
  double training_flops_per_sample(int64_t sample_tokens) const override {
    const auto* counted = dynamic_cast<const FlopCounted*>(module_.get());
    return counted ? counted->training_flops_per_sample(sample_tokens) : 0;
  }
  std::vector<std::vector<torch::Tensor>> units() const override {
    std::vector<std::vector<torch::Tensor>> out;
    if (const auto* split = dynamic_cast<const UnitModule*>(module_.get())) {
      for (const auto& unit : split->units()) out.push_back(unit->parameters(/*recurse=*/true));
    }
    return out;
  }
  void set_unit_hooks(UnitHooks* hooks) override {
    if (auto* split = dynamic_cast<UnitModule*>(module_.get())) split->set_unit_hooks(hooks);
  }
  void init_unit(size_t unit) override {
    auto* split = dynamic_cast<UnitModule*>(module_.get());
    if (!split) return Model::init_unit(unit);
    split->init_unit(unit);
  }
  void materialise() override { materialise_units(*module_); }

 private:
  static NamedTensors named(const torch::OrderedDict<std::string, torch::Tensor>& d) {
    NamedTensors out;
    for (const auto& item : d) out.emplace_back(item.key(), item.value());
    return out;
  }
  std::shared_ptr<torch::nn::Module> module_;
  std::function<torch::Tensor(const torch::Tensor&)> forward_;
  std::string name_;
};

class ScriptModel final : public Model {
 public:
  ScriptModel(torch::jit::Module module, std::string bytes, std::string name)
      : module_(std::move(module)), file_{"torchscript", std::move(bytes)}, name_(std::move(name)) {}
  std::pair<torch::Tensor, torch::Tensor> forward_with_loss(const torch::Tensor& input,
                                                            const torch::Tensor& targets) override {
    auto out = module_.forward({input, targets});
    const bool pair = out.isTuple() && out.toTupleRef().elements().size() == 2 &&
                      out.toTupleRef().elements()[0].isTensor() && out.toTupleRef().elements()[1].isTensor();
    MPIDDP_CHECK(pair, "the TorchScript model '" + name_ + "' returned " + out.tagKind() +
                           " from forward(inputs, targets), not a tuple (outputs, loss)");
    return {out.toTupleRef().elements()[0].toTensor(), out.toTupleRef().elements()[1].toTensor()};
  }
  torch::Tensor forward(const torch::Tensor& input) override {
    auto out = module_.forward({input});
    MPIDDP_CHECK(out.isTensor(),
                 "the TorchScript model '" + name_ + "' returned " + out.tagKind() + " from forward, not a tensor");
    return out.toTensor();
  }
  NamedTensors named_parameters() const override {
    NamedTensors out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
    return out;
  }
  NamedTensors named_buffers() const override {
    NamedTensors out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return out;
  }
  void train(bool on) override { module_.train(on); }
  void to(c10::Device device) override { module_.to(device); }
  std::string description() const override { return "torchscript " + module_.type()->name()->qualifiedName(); }
  const ModelFile& file() const override { return file_; }
  void save_file(std::ostream& out) const override { module_.save(out); }

 private:
  torch::jit::Module module_;
  ModelFile file_;
  std::string name_;
};

}  // namespace

const ModelFile& Model::file() const {
  static const ModelFile none;
  return none;
}

void Model::init_unit(size_t /*unit*/) {
  MPIDDP_THROW("the model (" + description() +
               ") has no units to initialise (deferred initialisation needs a UnitModule)");
}

bool has_deferred_parameters(const Model& model) {
  const auto params = model.named_parameters();
  return std::any_of(params.begin(), params.end(), [](const auto& named) { return is_deferred(named.second); });
}

void Model::set_activation_checkpointing(bool on) {
  if (!on) return;
  MPIDDP_THROW("activation checkpointing: the model (" + description() +
               ") cannot be split into blocks (the built-in gpt can; a C++ module can call mpiddp::checkpoint in its "
               "forward)");
}

void Model::save_file(std::ostream& /*out*/) const {
  MPIDDP_THROW("the model (" + description() + ") is a C++ module, not one loaded from a Python file");
}

std::shared_ptr<Model> wrap_module(std::shared_ptr<torch::nn::Module> module,
                                   std::function<torch::Tensor(const torch::Tensor&)> forward, std::string name) {
  MPIDDP_CHECK(module && forward, "wrap_module needs a module and its forward");
  return std::make_shared<ModuleModel>(std::move(module), std::move(forward), std::move(name));
}

std::shared_ptr<Model> load_torchscript_bytes(const std::string& bytes, const std::string& name) {
  torch::jit::Module module;
  try {
    std::istringstream in(bytes);
    module = torch::jit::load(in, torch::kCPU);
  } catch (const std::exception& e) {
    MPIDDP_THROW("'" + name + "' is not a TorchScript module (save one with torch.jit.script(model).save(PATH)): " +
                 first_line(e.what()));
  }
  MPIDDP_CHECK(module.find_method("forward").has_value(),
               "the TorchScript module in '" + name + "' has no forward method");
  return std::make_shared<ScriptModel>(std::move(module), bytes, name);
}

namespace {

// A model file's bytes, read once into a string of its size; `kind` ("TorchScript", ".pt2") names it
// in the one-line errors.
std::string model_file_bytes(const std::string& path, const std::string& kind) {
  MPIDDP_CHECK(std::filesystem::is_regular_file(path), kind + " file '" + path + "' does not exist");
  std::string bytes(std::filesystem::file_size(path), '\0');
  std::ifstream in(path, std::ios::binary);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  MPIDDP_CHECK(in.good(), "cannot read " + kind + " file '" + path + "'");
  return bytes;
}

}  // namespace

std::shared_ptr<Model> load_torchscript(const std::string& path) {
  return load_torchscript_bytes(model_file_bytes(path, "TorchScript"), path);
}

std::shared_ptr<Model> load_pt2(const std::string& path) {
  return load_pt2_bytes(model_file_bytes(path, ".pt2"), path);
}

std::shared_ptr<Model> load_model_file(const std::string& path) {
  return ends_with(path, ".pt2") ? load_pt2(path) : load_torchscript(path);
}

std::shared_ptr<Model> load_model_file(const ModelFile& file, const std::string& name) {
  if (file.format == "pt2") return load_pt2_bytes(file.bytes, name);
  MPIDDP_CHECK(file.format == "torchscript", "'" + name + "' is a model file of unknown format '" + file.format + "'");
  return load_torchscript_bytes(file.bytes, name);
}

std::pair<torch::Tensor, torch::Tensor> Model::forward_with_loss(const torch::Tensor&, const torch::Tensor&) {
  MPIDDP_THROW("the model (" + description() +
               ") does not compute its own loss (forward(inputs, targets) -> "
               "(outputs, loss)): train it with a loss function instead");
}

void load_named(Model& model, const std::map<std::string, torch::Tensor>& tensors, const std::string& prefix) {
  torch::NoGradGuard no_grad;
  auto load = [&](const NamedTensors& named, const char* what) {
    for (const auto& [name, t] : named) {
      auto it = tensors.find(prefix + name);
      MPIDDP_CHECK(it != tensors.end(), std::string("no tensor for the model's ") + what + " '" + name + "'");
      MPIDDP_CHECK(it->second.sizes() == t.sizes(), std::string("the model's ") + what + " '" + name + "' is " +
                                                        shape_text(t.sizes()) + " but the tensor given is " +
                                                        shape_text(it->second.sizes()));
      MPIDDP_CHECK(!is_deferred(t), std::string("the model's ") + what + " '" + name +
                                        "' is deferred (no memory yet): materialise the model before loading into it");
      t.copy_(it->second);
    }
  };
  load(model.named_parameters(), "parameter");
  load(model.named_buffers(), "buffer");
}

std::map<std::string, torch::Tensor> read_state_dict(const std::string& path) {
  MPIDDP_CHECK(std::filesystem::is_regular_file(path), "state_dict file '" + path + "' does not exist");
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
    // libtorch's unpickler (1.13 at least) reads a collections.OrderedDict, which state_dict()
    // returns, as None: such a file must be saved as a plain dict.
    if (!value.isGenericDict()) MPIDDP_THROW("it holds a " + value.tagKind() + ", not a dict");
  } catch (const std::exception& e) {
    MPIDDP_THROW("cannot read '" + path + "' as a state_dict (" + first_line(e.what()) +
                 "): save a plain dict of tensors, torch.save(dict(model.state_dict()), PATH)");
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : value.toGenericDict()) {
    MPIDDP_CHECK(item.key().isString() && item.value().isTensor(),
                 "'" + path + "' is not a state_dict: it holds an entry that is not a name and a tensor");
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

std::vector<torch::Tensor> parameters(const Model& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : detail::distinct(model.named_parameters())) out.push_back(p.second);
  return out;
}

std::vector<torch::Tensor> trainable_parameters(const Model& model) {
  auto out = parameters(model);
  out.erase(std::remove_if(out.begin(), out.end(), [](const torch::Tensor& p) { return !p.requires_grad(); }),
            out.end());
  return out;
}

}  // namespace mpiddp
