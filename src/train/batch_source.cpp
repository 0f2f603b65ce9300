#include "train/batch_source.hpp"

#include <mpiddp/error.hpp>

#include <algorithm>

#include "common/text.hpp"

namespace mpiddp::detail {

DistributedSampler sampler_for(const SampleSet& data, const TrainerOptions& options, const Runtime& runtime) {
  return DistributedSampler(data.size(), runtime.rank(), runtime.size(), options.shuffle, options.seed,
                            options.drop_last);
}

namespace {

// Steps whose batches a cached set gathers at once: up to 8 MiB of float inputs.
int64_t steps_per_block(const SampleSet& data, int64_t batch_size) {
  int64_t sample_floats = 1;
  for (auto d : data.info().sample_shape) sample_floats *= d;
  return std::max<int64_t>(1, (int64_t{8} << 20) / (4 * std::max<int64_t>(1, sample_floats) * batch_size));
}

}  // namespace

int BatchSource::read_ahead(SampleSet& data, const TrainerOptions& o, const Runtime& runtime,
                            const std::function<void(const std::string&)>& note) {
  // A training set too large to cache is read batch by batch. Without a reader thread, with a
  // parallel HDF5, each step's reads are one collective MPI-IO read (every rank takes the same
  // number of steps); the reader thread reads on its own (POSIX I/O), as collective calls belong
  // to the training thread. A cached training set on the CPU is read on the training thread
  // whatever --prefetch says: a step then only slices a block gathered once per 8 MiB, and handing
  // each slice over from a reader thread cost more than it (12-15 us per step of the toy at 2
  // ranks on 2 cores).
  const int depth = data.cached() && o.device.is_cpu() ? 0 : o.prefetch_batches;
  if (depth == 0 && data.open_parallel(runtime.world())) {
    note("data: '" + o.data + "' is larger than the cache limit: read per batch, one collective MPI-IO read per step");
  } else if (!data.cached()) {
    note("data: '" + o.data + "' is larger than the cache limit: read per batch" +
         (depth > 0 ? ", " + std::to_string(depth) + " batch(es) ahead by a reader thread" : std::string()));
  }
  return depth;
}

BatchSource::BatchSource(SampleSet& data, const TrainerOptions& options, const Runtime& runtime, const RunPlan& plan,
                         const RunPosition& from, int depth)
    : data_(data),
      options_(options),
      steps_per_epoch_(plan.steps_per_epoch),
      first_offset_(plan.offset(from)),
      first_global_(from.global_step),
      block_steps_(steps_per_block(data, options.samples_per_step())),
      sampler_(sampler_for(data, options, runtime)),
      batches_([this](int64_t i) { return read(i); }, plan.steps_left(from), depth) {}

Example BatchSource::read(int64_t i) {
  const auto& o = options_;
  const int64_t epoch = (first_offset_ + i) / steps_per_epoch_, s = (first_offset_ + i) % steps_per_epoch_;
  try {
    if (epoch != epoch_) {
      sampler_.set_epoch(epoch);
      indices_ = sampler_.indices();
      epoch_ = epoch;
      block_first_ = -1;
    }
    const int64_t rows = o.samples_per_step();
    const auto at = [&](int64_t step) { return indices_.begin() + step * rows; };
    Example e;
    if (!data_.cached()) {
      e = data_.read_collective(std::vector<int64_t>(at(s), at(s + 1)));
    } else {
      // A cached set is gathered a block of steps at a time, and each step takes a slice of the
      // block: the same rows, one gather instead of one per step.
      if (block_first_ < 0 || s >= block_first_ + block_steps_) {  // steps only rise within an epoch
        const int64_t last = std::min(steps_per_epoch_, s + block_steps_);
        block_ = data_.read(std::vector<int64_t>(at(s), at(last)));
        block_first_ = s;
      }
      const int64_t row = (s - block_first_) * rows;
      e = {block_.inputs.narrow(0, row, rows), block_.targets.narrow(0, row, rows)};
    }
    if (o.device.is_cuda()) {  // page-locked: the copy to the GPU can overlap the step
      e.inputs = e.inputs.pin_memory();
      e.targets = e.targets.pin_memory();
    }
    return e;
  } catch (const std::exception& error) {
    const RunPosition failed{epoch, s, first_global_ + i};
    MPIDDP_THROW("cannot read the batch of " + failed.where() + " from '" + o.data + "': " + detail::reason_of(error));
  }
}

}  // namespace mpiddp::detail
