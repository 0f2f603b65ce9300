// A .pt2 program (torch.export) as an mpiddp::Model: the archive's weights as the module's
// parameters and buffers, its training program run by the executor (pt2_program.hpp), its eval
// program for evaluation where the archive holds one.
#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/model.hpp>

#if MPIDDP_HAS_PT2
#include <ATen/Context.h>

#include <mutex>

#include "common/distinct.hpp"
#include "common/text.hpp"
#include "pt2/pt2_archive.hpp"
#include "pt2/pt2_program.hpp"
#endif

namespace mpiddp {

#if MPIDDP_HAS_PT2

namespace {

using detail::Pt2Archive;
using detail::Pt2Input;
using detail::Pt2Output;
using detail::Pt2Program;

constexpr const char* kTrainProgram = "model";  // torch.export.save's name for a lone program
constexpr const char* kEvalProgram = "eval";

class Pt2Model final : public Model {
 public:
  Pt2Model(std::string bytes, const std::string& name) : file_{"pt2", std::move(bytes)}, archive_(file_.bytes, name) {
    const auto programs = archive_.programs();
    const auto train = archive_.has_program(kTrainProgram) ? kTrainProgram : programs.front();
    train_ = std::make_unique<Pt2Program>(archive_.program(train), "'" + name + "' program '" + train + "'");
    if (archive_.has_program(kEvalProgram) && train != std::string(kEvalProgram)) {
      eval_ = std::make_unique<Pt2Program>(archive_.program(kEvalProgram),
                                           "'" + name + "' program '" + std::string(kEvalProgram) + "'");
    }
    load_tensors(train);
    train_inputs_ = bind(*train_, constants_);
    if (eval_) {
      for (auto& [name, stored] : archive_.constants(kEvalProgram)) eval_constants_.emplace_back(name, stored.tensor);
      eval_inputs_ = bind(*eval_, eval_constants_);
    }
    nodes_ = archive_.program(train).at("graph_module").at("graph").at("nodes").size();
  }

  torch::Tensor forward(const torch::Tensor& input) override {
    auto out = run({input});
    MPIDDP_CHECK(out.size() == 1 && out[0].isTensor(),
                 "'" + archive_.name() + "' returned " + std::to_string(out.size()) +
                     " outputs from forward(inputs), not one tensor (a program that returns (outputs, loss) "
                     "takes --loss model)");
    return out[0].toTensor();
  }
  std::pair<torch::Tensor, torch::Tensor> forward_with_loss(const torch::Tensor& input,
                                                            const torch::Tensor& targets) override {
    auto out = run({input, targets});
    MPIDDP_CHECK(out.size() == 2 && out[0].isTensor() && out[1].isTensor() && out[1].toTensor().dim() == 0,
                 "'" + archive_.name() + "' returned " + std::to_string(out.size()) +
                     " outputs from forward(inputs, targets), not (outputs, loss) with the loss a scalar");
    return {out[0].toTensor(), out[1].toTensor()};
  }
  NamedTensors named_parameters() const override { return parameters_; }
  NamedTensors named_buffers() const override { return buffers_; }
  void train(bool on) override {
    if (on == training_) return;
    training_ = on;
    if (eval_) return;
    // Evaluation with the training program: its in-place buffer updates (BatchNorm's running
    // statistics) and its random draws (dropout) are undone when training resumes, as evaluation
    // must leave the model and the run's random sequence as they were.
    torch::NoGradGuard no_grad;
    auto generator = at::globalContext().defaultGenerator(device_);
    std::lock_guard<std::mutex> lock(generator.mutex());
    if (!on) {
      saved_buffers_.clear();
      for (const auto& [name, b] : buffers_) saved_buffers_.push_back(b.clone());
      saved_generator_ = generator.get_state();
    } else {
      for (size_t i = 0; i < saved_buffers_.size(); ++i) buffers_[i].second.copy_(saved_buffers_[i]);
      saved_buffers_.clear();
      generator.set_state(saved_generator_);
    }
  }
  void to(c10::Device device) override {
    NamedTensors all = parameters_;  // a tensor under several names (tied, or also a constant) moves once
    for (const auto* named : {&buffers_, &constants_, &eval_constants_})
      all.insert(all.end(), named->begin(), named->end());
    for (const auto& [name, t] : detail::distinct(all)) t.set_data(t.data().to(device));
    device_ = device;
  }
  std::string description() const override { return "pt2 program (" + std::to_string(nodes_) + " nodes)"; }
  const ModelFile& file() const override { return file_; }
  void save_file(std::ostream& out) const override {
    std::map<std::string, torch::Tensor> values;
    for (const auto& [name, t] : parameters_) values[name] = t;
    for (const auto& [name, t] : buffers_) values[name] = t;
    const auto bytes = archive_.with_weights(values);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::vector<std::string> notes() const override {
    if (eval_) return {};
    return {"note: '" + archive_.name() +
            "' holds no eval program (torch.export of model.eval() saved as 'eval'): "
            "evaluation runs the training program under no_grad (dropout and batch statistics on), its buffers "
            "and random state restored after"};
  }

  // A batch dimension exported static: the first input's first size.
  int64_t fixed_batch_size() const override {
    const auto& sizes = train_->user_input_sizes();
    return sizes.empty() || sizes.front().empty() ? 0 : std::max<int64_t>(0, sizes.front().front());
  }

 private:
  // The training program's weights: parameters (tied ones one tensor under each name) and
  // persistent buffers, the module's state_dict; its constants: non-persistent buffers and tensor
  // constants, which the archive keeps. The eval program reads the same weights by name, and
  // constants of its own.
  void load_tensors(const std::string& program) {
    for (auto& [name, stored] : archive_.weights(program)) {
      if (stored.is_param) {
        stored.tensor.set_requires_grad(stored.requires_grad);
        parameters_.emplace_back(name, stored.tensor);
      } else {
        buffers_.emplace_back(name, stored.tensor);
      }
    }
    for (auto& [name, stored] : archive_.constants(program)) constants_.emplace_back(name, stored.tensor);
  }

  static const torch::Tensor* find(const NamedTensors& named, const std::string& name) {
    for (const auto& [n, t] : named)
      if (n == name) return &t;
    return nullptr;
  }

  // One value per program input: the module's tensors bound once (moved in place by to(), so the
  // binding stays valid); user inputs left empty.
  std::vector<c10::IValue> bind(const Pt2Program& program, const NamedTensors& constants) const {
    std::vector<c10::IValue> out;
    for (const auto& in : program.inputs()) {
      const torch::Tensor* t = nullptr;
      switch (in.kind) {
        case Pt2Input::Kind::Parameter:
          t = find(parameters_, in.target);
          break;
        case Pt2Input::Kind::Buffer:
          t = in.persistent ? find(buffers_, in.target) : find(constants, in.target);
          break;
        case Pt2Input::Kind::Constant:
          t = find(constants, in.target);
          break;
        case Pt2Input::Kind::User:
          out.emplace_back();
          continue;
        case Pt2Input::Kind::Value:
          out.push_back(in.value);
          continue;
      }
      MPIDDP_CHECK(t, "'" + archive_.name() + "' has no weight blob for '" + in.target + "', which its program reads");
      out.emplace_back(*t);
    }
    return out;
  }

  void check_sizes(const Pt2Program& program, const std::vector<torch::Tensor>& user) const {
    const auto& exported = program.user_input_sizes();
    MPIDDP_CHECK(exported.size() == user.size(), "'" + archive_.name() + "' takes " + std::to_string(exported.size()) +
                                                     " inputs, given " + std::to_string(user.size()) +
                                                     " (forward(inputs, targets) programs take --loss model)");
    for (size_t i = 0; i < user.size(); ++i) {
      const auto& sizes = exported[i];
      bool fits = sizes.empty() || static_cast<int64_t>(sizes.size()) == user[i].dim();
      for (size_t d = 0; fits && d < sizes.size(); ++d) fits = sizes[d] < 0 || sizes[d] == user[i].size(d);
      if (fits) continue;
      std::string shape = "[";
      for (size_t d = 0; d < sizes.size(); ++d)
        shape += (d ? ", " : "") + (sizes[d] < 0 ? "*" : std::to_string(sizes[d]));
      MPIDDP_THROW("'" + archive_.name() + "' was exported for input " + std::to_string(i) + " of shape " + shape +
                   "], given " + detail::shape_text(user[i].sizes()) +
                   " (export with dynamic_shapes to let a dimension vary, e.g. the batch)");
    }
  }

  std::vector<c10::IValue> run(const std::vector<torch::Tensor>& user) {
    const bool evaluating = !training_ && eval_;
    const auto& program = evaluating ? *eval_ : *train_;
    check_sizes(program, user);
    auto inputs = evaluating ? eval_inputs_ : train_inputs_;
    size_t next = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (program.inputs()[i].kind == Pt2Input::Kind::User) inputs[i] = user[next++];
    }
    auto results = program.run(std::move(inputs), device_);
    std::vector<c10::IValue> out;
    for (size_t i = 0; i < results.size() && i < program.outputs().size(); ++i) {
      const auto& spec = program.outputs()[i];
      if (spec.kind == Pt2Output::Kind::User) {
        out.push_back(std::move(results[i]));
      } else if (spec.kind == Pt2Output::Kind::BufferMutation || spec.kind == Pt2Output::Kind::ParameterMutation) {
        const auto* t = find(spec.kind == Pt2Output::Kind::BufferMutation ? buffers_ : parameters_, spec.target);
        MPIDDP_CHECK(t, "'" + archive_.name() + "' mutates '" + spec.target + "', which it does not hold");
        torch::NoGradGuard no_grad;
        t->copy_(results[i].toTensor());
      }
    }
    return out;
  }

  ModelFile file_;
  Pt2Archive archive_;
  std::unique_ptr<Pt2Program> train_, eval_;
  NamedTensors parameters_, buffers_, constants_, eval_constants_;
  std::vector<c10::IValue> train_inputs_, eval_inputs_;
  std::vector<torch::Tensor> saved_buffers_;
  torch::Tensor saved_generator_;
  c10::Device device_ = c10::kCPU;
  bool training_ = true;
  size_t nodes_ = 0;
};

}  // namespace

std::shared_ptr<Model> load_pt2_bytes(std::string bytes, const std::string& name) {
  return std::make_shared<Pt2Model>(std::move(bytes), name);
}

#else

std::shared_ptr<Model> load_pt2_bytes(std::string /*bytes*/, const std::string& name) {
  MPIDDP_THROW("'" + name + "': .pt2 programs (torch.export) need libtorch >= 2.6; this mpiddp is built on " +
               compat::torch_version() + " (train a TorchScript model here, or use the sid or pip stack)");
}

#endif

}  // namespace mpiddp
