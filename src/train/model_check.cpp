#include "train/model_check.hpp"

#include <mpiddp/error.hpp>

#include <algorithm>
#include <exception>

#include "common/text.hpp"
#include "train/agreed.hpp"
#include "train/forward_loss.hpp"
#include "train/task.hpp"

namespace mpiddp::detail {

namespace {

void check_whole_model_fits_data(const ForwardLoss& forward, const Task& task, const SampleSet& train,
                                 const SampleSet* test) {
  torch::NoGradGuard no_grad;  // and evaluation mode: no buffer, no RNG changes
  auto probe = train.read_range(0, std::min<int64_t>(2, train.size()));
  // Token ids index the model's embedding: the probe uses token 0 alone, which every vocabulary
  // has, and the tokens are checked against the logits' width below.
  probe.inputs = task.probe_inputs(probe.inputs);
  Model& model = forward.model();
  struct BackToTraining {
    Model& model;
    ~BackToTraining() { model.train(true); }
  } back{model};
  model.train(false);
  torch::Tensor out;
  const auto device = forward.device();
  try {
    out = forward.model_loss() ? forward(probe.inputs.to(device), torch::zeros_like(probe.targets).to(device)).first
                               : forward.forward(probe.inputs.to(device));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    MPIDDP_THROW("the model (" + model.description() + ") fails on inputs of " + shape_text(probe.inputs.sizes()) +
                 ": " + first_line(e.what()));
  }
  task.check_outputs(out, probe.targets);
  if (task.has_labels()) {  // every label (token) a class of the model's outputs
    train.check_labels(out.size(-1));
    if (test) test->check_labels(out.size(-1));
  }
}

}  // namespace

void check_model_fits_data(const ForwardLoss& forward, const Task& task, const SampleSet& train, const SampleSet* test,
                           bool sharded) {
  if (!sharded) return check_whole_model_fits_data(forward, task, train, test);
  as_agreed([&] { check_whole_model_fits_data(forward, task, train, test); });
}

}  // namespace mpiddp::detail
