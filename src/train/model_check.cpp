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
  torch::NoGradGuard no_grad;                                // and evaluation mode: no buffer, no RNG changes
  const int64_t fixed = forward.model().fixed_batch_size();  // a program with static shapes takes no other
  auto probe = train.read_range(0, std::min<int64_t>(fixed > 0 ? fixed : 2, train.size()));
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
                           int64_t batch_size, bool sharded) {
  const Model& model = forward.model();
  const int64_t fixed = model.fixed_batch_size();
  const auto fixed_batch = [&] {
    return "the model (" + model.description() + ") takes batches of exactly " + std::to_string(fixed) +
           " (exported with static shapes): ";
  };
  MPIDDP_CHECK(fixed == 0 || fixed == batch_size, fixed_batch() + "train it at --batch-size " + std::to_string(fixed) +
                                                      ", or export it with a dynamic batch dimension");
  MPIDDP_CHECK(fixed == 0 || !test, fixed_batch() +
                                        "evaluation reads other batch sizes; export it with a dynamic "
                                        "batch dimension to evaluate it");
  if (!sharded) return check_whole_model_fits_data(forward, task, train, test);
  as_agreed([&] { check_whole_model_fits_data(forward, task, train, test); });
}

}  // namespace mpiddp::detail
