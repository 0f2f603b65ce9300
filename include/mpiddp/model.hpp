// Model: what mpiddp::Trainer trains, behind one interface: a C++ torch::nn::Module (wrap_module),
// a TorchScript module saved from Python (load_torchscript) or a torch.export program (load_pt2).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace mpiddp {

class UnitHooks;

/// A C++ module that knows its training FLOPs (the built-in GPT). Model::training_flops_per_sample
/// asks it through wrap_module.
class FlopCounted {
 public:
  virtual ~FlopCounted() = default;
  /// Model FLOPs of one sample's forward and backward, for a sample of `sample_tokens` tokens
  /// (token data's block size; 0 for data without tokens).
  virtual double training_flops_per_sample(int64_t sample_tokens) const = 0;
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// The file a model from Python was loaded from: its format ("torchscript" | "pt2"; "" for a C++
/// module) and its bytes. Snapshots carry it, so that `mpiddp export` can write the trained model back.
struct ModelFile {
  std::string format;
  std::string bytes;
};

class Model {
 public:
  virtual ~Model() = default;
  /// One batch of inputs to the outputs the loss takes.
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;
  /// A model that computes its own loss, as nanoGPT's GPT: forward(input, targets) returns
  /// (outputs, loss), the loss a scalar (TrainerOptions::model_loss, `--loss model`). The default
  /// throws mpiddp::Error: the model has no such forward.
  virtual std::pair<torch::Tensor, torch::Tensor> forward_with_loss(const torch::Tensor& input,
                                                                    const torch::Tensor& targets);
  /// Every parameter and buffer, with its dotted name (as PyTorch's state_dict names it).
  virtual NamedTensors named_parameters() const = 0;
  virtual NamedTensors named_buffers() const = 0;
  /// Training or evaluation mode (Dropout, BatchNorm).
  virtual void train(bool on) = 0;
  /// Moves parameters and buffers in place (an optimizer built on them stays valid).
  virtual void to(c10::Device device) = 0;
  /// What the model is, for messages and snapshots ("cnn", "TwoLayer", "torchscript __torch__.Net").
  virtual std::string description() const = 0;
  /// The file this model was loaded from (an empty format for a C++ module).
  virtual const ModelFile& file() const;
  /// Writes the model in its file's format with its current parameters and buffers (torch.jit.load
  /// or torch.export.load reads it); throws mpiddp::Error for a C++ module.
  virtual void save_file(std::ostream& out) const;
  /// The one batch size the model takes (a program exported with static shapes); 0: any.
  virtual int64_t fixed_batch_size() const { return 0; }
  /// What a user should know before training it, a line each ("note: ..."); none by default.
  virtual std::vector<std::string> notes() const { return {}; }
  /// Runs the model's blocks checkpointed (include/mpiddp/checkpoint.hpp) from now on, or not. A C++
  /// module that implements mpiddp::Checkpointable can (the built-in GPT); anything else throws
  /// mpiddp::Error (one line): it cannot be split into blocks.
  virtual void set_activation_checkpointing(bool on);
  /// Model FLOPs of one sample's forward and backward, a sample being `sample_tokens` tokens (token
  /// data's block size; 0 otherwise); 0: unknown. A C++ module that implements mpiddp::FlopCounted
  /// knows its own (the built-in GPT); anything else: 0.
  virtual double training_flops_per_sample(int64_t /*sample_tokens*/) const { return 0; }
  /// ZeRO stage 3's units (units.hpp): each unit's parameters, in the order forward runs the units;
  /// empty for a model without units (a TorchScript module, a C++ module that is no UnitModule).
  virtual std::vector<std::vector<torch::Tensor>> units() const { return {}; }
  /// Runs the units' forwards through `hooks` from now on (nullptr: plainly). Nothing without units.
  virtual void set_unit_hooks(UnitHooks* /*hooks*/) {}
  /// Deferred initialisation (units.hpp): writes unit `unit`'s initial values into its parameters,
  /// which have memory now (UnitModule::init_unit); mpiddp::Error for a model without units.
  virtual void init_unit(size_t unit);
  /// Gives every deferred parameter memory and its initial values, unit by unit (materialise_units);
  /// nothing where none is deferred.
  virtual void materialise() {}
  /// The underlying C++ module (nullptr for TorchScript).
  virtual std::shared_ptr<torch::nn::Module> module() const { return nullptr; }
};

/// A C++ module with `Tensor forward(const Tensor&)`, given as its holder (TORCH_MODULE) or as a
/// shared_ptr to it. `name` labels it in snapshots (default: the module's own name()).
std::shared_ptr<Model> wrap_module(std::shared_ptr<torch::nn::Module> module,
                                   std::function<torch::Tensor(const torch::Tensor&)> forward, std::string name = "");
template <class Impl>
std::shared_ptr<Model> wrap_module(std::shared_ptr<Impl> module, std::string name = "") {
  auto* raw = module.get();
  return wrap_module(
      std::static_pointer_cast<torch::nn::Module>(module), [raw](const torch::Tensor& x) { return raw->forward(x); },
      std::move(name));
}
template <class Impl>
std::shared_ptr<Model> wrap_module(const torch::nn::ModuleHolder<Impl>& module, std::string name = "") {
  return wrap_module(module.ptr(), std::move(name));
}

/// Loads a TorchScript module (torch.jit.script(model).save(PATH) in Python) on the CPU. Throws
/// mpiddp::Error with a one-line reason: missing file, not TorchScript, no forward method.
std::shared_ptr<Model> load_torchscript(const std::string& path);
/// The same from the file's bytes (`name` is used in messages).
std::shared_ptr<Model> load_torchscript_bytes(const std::string& bytes, const std::string& name);

/// Loads a torch.export program (torch.export.save(torch.export.export(model.train(), args), PATH)
/// in Python) on the CPU: its weights as parameters and buffers, its training program run node by
/// node through libtorch's dispatcher (src/pt2), its `eval` program, where the archive holds one,
/// for evaluation. Throws mpiddp::Error with a one-line reason: missing file, not a .pt2 archive,
/// another schema major, an op it cannot run, a missing weight, libtorch older than 2.6.
std::shared_ptr<Model> load_pt2(const std::string& path);
/// The same from the file's bytes (`name` is used in messages).
std::shared_ptr<Model> load_pt2_bytes(std::string bytes, const std::string& name);
/// A model file from Python: a .pt2 program by the file's extension, else TorchScript.
std::shared_ptr<Model> load_model_file(const std::string& path);
/// The same from a ModelFile (a snapshot's), by its format.
std::shared_ptr<Model> load_model_file(const ModelFile& file, const std::string& name);

/// Copies tensors by name into the model's parameters and buffers (no autograd record); throws
/// mpiddp::Error naming the first missing name or shape mismatch. `prefix` is prepended to the
/// model's names when looking them up ("model/" for a snapshot's tensors).
void load_named(Model& model, const std::map<std::string, torch::Tensor>& tensors, const std::string& prefix = "");

/// Reads a state_dict file as Python's torch.save(model.state_dict(), PATH) writes it (and `mpiddp
/// export --format state-dict`): tensors by name, on the CPU. Throws mpiddp::Error naming the file
/// when it is missing or not such a file.
std::map<std::string, torch::Tensor> read_state_dict(const std::string& path);

/// Whether any of the model's parameters is deferred (units.hpp: a shape without memory yet).
bool has_deferred_parameters(const Model& model);
/// The model's parameters (for building an optimizer), each tensor once (a tied weight, e.g. the
/// GPT's lm_head/wte, under its first name only: PyTorch's named_parameters()).
std::vector<torch::Tensor> parameters(const Model& model);
/// Those of them that require grad: what an optimizer steps and clipping scales.
std::vector<torch::Tensor> trainable_parameters(const Model& model);

}  // namespace mpiddp
