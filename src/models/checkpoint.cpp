// Activation checkpointing (see include/mpiddp/checkpoint.hpp). One autograd function: forward
// runs the user's function without a graph and keeps its inputs, the random generators' states
// and autocast's; backward sets those, runs the function again with a graph, and asks autograd
// for the gradients of the inputs and the listed parameters (torch::autograd::grad, which
// accumulates nothing), which it returns as its own. The parameters are inputs of the function
// for that reason: their gradients then reach their .grad through the caller's backward pass, so
// DDP's hooks and its end-of-backward callback belong to that pass (a nested backward that
// accumulated into .grad would run DDP's end of pass at the end of the nested one, too early).
#include <mpiddp/checkpoint.hpp>
#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/precision.hpp>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <optional>
#include <unordered_set>

namespace mpiddp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The random generators a function may draw from: the CPU's and, where an input is on a CUDA
/// device, that device's.
std::vector<at::Generator> generators_of(const std::vector<torch::Tensor>& inputs) {
  std::vector<at::Generator> out{at::detail::getDefaultCPUGenerator()};
  for (const auto& t : inputs) {
    if (t.defined() && t.is_cuda()) {
      out.push_back(at::globalContext().defaultGenerator(t.device()));
      break;
    }
  }
  return out;
}

std::vector<torch::Tensor> states_of(std::vector<at::Generator>& generators) {
  std::vector<torch::Tensor> states;
  for (auto& g : generators) {
    std::lock_guard<std::mutex> lock(g.mutex());
    states.push_back(g.get_state());
  }
  return states;
}

void set_states(std::vector<at::Generator>& generators, const std::vector<torch::Tensor>& states) {
  for (size_t i = 0; i < generators.size(); ++i) {
    std::lock_guard<std::mutex> lock(generators[i].mutex());
    generators[i].set_state(states[i]);
  }
}

/// What backward needs besides the saved tensors: the function, how many of the saved tensors are
/// its inputs (the rest are the listed parameters), and the state forward ran in.
struct Recompute : torch::CustomClassHolder {
  TensorsFunction fn;
  size_t inputs = 0;
  std::vector<at::Generator> generators;
  std::vector<torch::Tensor> rng_states;
  c10::DeviceType device = c10::DeviceType::CPU;
  bool autocast = false;
  c10::ScalarType autocast_dtype = c10::kFloat;
};

/// Every leaf that needs a gradient and that `outputs` were computed from, by its AccumulateGrad
/// node (found by walking the graph back from the outputs).
std::vector<torch::Tensor> leaves_of(const std::vector<torch::Tensor>& outputs) {
  std::vector<torch::Tensor> leaves;
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  for (const auto& o : outputs)
    if (o.defined() && o.grad_fn()) todo.push_back(o.grad_fn().get());
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) leaves.push_back(acc->variable);
    for (const auto& edge : node->next_edges())
      if (edge.function) todo.push_back(edge.function.get());
  }
  return leaves;
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // saved: the function's inputs, then the parameters it reads.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Recompute> recompute, at::TensorList saved) {
    std::vector<torch::Tensor> all(saved.begin(), saved.end());
    std::vector<torch::Tensor> inputs(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(recompute->inputs));
    recompute->generators = generators_of(inputs);
    recompute->rng_states = states_of(recompute->generators);
    for (const auto& t : inputs)
      if (t.defined()) {
        recompute->device = t.device().type();
        break;
      }
    recompute->autocast = compat::autocast_enabled(recompute->device);
    recompute->autocast_dtype = compat::autocast_dtype(recompute->device);
    ctx->save_for_backward(all);
    auto outputs = recompute->fn(inputs);  // autograd's Function runs forward without a graph
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto recompute = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const auto n_inputs = recompute->inputs;
    std::vector<torch::Tensor> inputs, wanted;  // wanted: what gradients are asked of
    std::vector<size_t> wanted_at;              // its position among saved
    for (size_t i = 0; i < saved.size(); ++i) {
      torch::Tensor t = saved[i];
      if (i < n_inputs) {
        t = t.defined() ? t.detach().requires_grad_(saved[i].requires_grad()) : t;
        inputs.push_back(t);
      }
      if (t.defined() && t.requires_grad()) {
        wanted.push_back(t);
        wanted_at.push_back(i);
      }
    }
    std::vector<torch::Tensor> outputs;
    {
      auto now = states_of(recompute->generators);
      set_states(recompute->generators, recompute->rng_states);
      try {
        torch::AutoGradMode grad(true);
        std::optional<Autocast> autocast;
        if (recompute->autocast) autocast.emplace(c10::Device(recompute->device), recompute->autocast_dtype);
        outputs = recompute->fn(inputs);
      } catch (...) {
        set_states(recompute->generators, now);
        throw;
      }
      set_states(recompute->generators, now);
    }
    std::unordered_set<torch::TensorImpl*> known;  // the leaves gradients are asked of
    for (const auto& t : wanted) known.insert(t.unsafeGetTensorImpl());
    for (const auto& leaf : leaves_of(outputs)) {
      MPIDDP_CHECK(known.count(leaf.unsafeGetTensorImpl()) != 0,
                   "checkpoint: the function reads a tensor that needs a gradient (shape " + c10::str(leaf.sizes()) +
                       ") but is neither an input nor one of the parameters given");
    }
    std::vector<torch::Tensor> outs, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        outs.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    variable_list result(1 + saved.size());  // the Recompute argument first: no gradient
    if (outs.empty() || wanted.empty()) return result;
    auto got = torch::autograd::grad(outs, wanted, grads, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true);
    for (size_t k = 0; k < wanted.size(); ++k) result[1 + wanted_at[k]] = got[k];
    return result;
  }
};

}  // namespace

std::vector<torch::Tensor> checkpoint(const TensorsFunction& fn, const std::vector<torch::Tensor>& inputs,
                                      const std::vector<torch::Tensor>& parameters) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->fn = fn;
  recompute->inputs = inputs.size();
  std::vector<torch::Tensor> saved = inputs;
  saved.insert(saved.end(), parameters.begin(), parameters.end());
  return CheckpointFunction::apply(recompute, at::TensorList(saved));
}

torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input,
                         const std::vector<torch::Tensor>& parameters) {
  auto outputs =
      checkpoint([fn](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{fn(in[0])}; }, {input},
                 parameters);
  return outputs[0];
}

}  // namespace mpiddp
