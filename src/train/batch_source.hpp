// BatchSource: the training batches of the rest of a run, in the loop's order (epoch by epoch, the
// DistributedSampler's order within each), read `depth` steps ahead by a BatchPrefetcher.
//
// Cross-rank contract: every rank takes the same number of batches (the run plan is the same on
// every rank). Without a reader thread, an uncached training set with a parallel HDF5 is read by
// one collective MPI-IO read per step, so next() is then a collective call.
#pragma once

#include <mpiddp/data.hpp>
#include <mpiddp/trainer.hpp>

#include <functional>
#include <mutex>
#include <string>

#include "common/run_position.hpp"

namespace mpiddp::detail {

/// The sampler this rank draws its samples from (the options' shuffle, seed and drop_last): the one
/// rule, for the batches and for counting the steps of an epoch.
DistributedSampler sampler_for(const SampleSet& data, const TrainerOptions& options, const Runtime& runtime);

class BatchSource {
 public:
  /// How many batches to read ahead (0: on the training thread); opens the set for collective
  /// MPI-IO reads where that applies (collective) and tells `note` how the set will be read.
  static int read_ahead(SampleSet& data, const TrainerOptions& options, const Runtime& runtime,
                        const std::function<void(const std::string&)>& note);
  /// Batches from `from` to the end of `plan`, `depth` ahead (read_ahead()'s answer).
  BatchSource(SampleSet& data, const TrainerOptions& options, const Runtime& runtime, const RunPlan& plan,
              const RunPosition& from, int depth);
  BatchSource(const BatchSource&) = delete;
  BatchSource& operator=(const BatchSource&) = delete;

  /// The next step's batch (pinned when training on CUDA); throws naming the step it failed on.
  Example next() { return batches_.next(); }
  /// Holds the reader thread between two reads (HDF5 is not thread-safe): take it around any
  /// other HDF5 use (evaluation, snapshots, callbacks).
  std::unique_lock<std::mutex> pause() { return batches_.pause(); }

 private:
  Example read(int64_t i);  ///< the i-th batch from `from`; on the reader thread when depth > 0

  SampleSet& data_;
  const TrainerOptions& options_;
  const int64_t steps_per_epoch_, first_offset_, first_global_, block_steps_;
  DistributedSampler sampler_;
  // The reader's own state (one thread calls read()): the epoch's indices, and for a cached set
  // the block of steps gathered at once.
  std::vector<int64_t> indices_;
  Example block_;
  int64_t epoch_ = -1, block_first_ = -1;
  BatchPrefetcher batches_;  // last: its thread calls read() and must stop before the rest goes
};

}  // namespace mpiddp::detail
