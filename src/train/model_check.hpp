// The model against the data, before it trains: a model that takes one batch size only (a program
// exported with static shapes) must be trained at it; one forward (evaluation mode, no gradient: no
// buffer or RNG changes) on the training set's first two samples (that batch size's) must run, its outputs must fit
// the targets (Task::check_outputs) and, where the targets are labels, cover every label of the
// training and the test set.
//
// Cross-rank contract: local while the model is whole (the Trainer's constructor runs it and calls
// no collective). Once ZeRO stage 3 has sharded the model's units (`sharded`) the forward gathers
// them, so every rank must run it: every rank then checks the same samples, its verdict is every
// rank's, and a failure is thrown as an AgreedError (agreed.hpp).
#pragma once

#include <mpiddp/data.hpp>

namespace mpiddp::detail {

class ForwardLoss;
class Task;

/// Throws mpiddp::Error (one line; AgreedError where `sharded`) naming the model and the inputs'
/// shape when the model does not take the set's inputs or its outputs do not fit, or not batches of
/// `batch_size`. `test`: null for none.
void check_model_fits_data(const ForwardLoss& forward, const Task& task, const SampleSet& train, const SampleSet* test,
                           int64_t batch_size, bool sharded);

}  // namespace mpiddp::detail
