// The memory plan of a training run, in one room: what it reads of the run (PlannedRun), the probe
// that measures one micro-batch's activations, the rule that adds the parts up by ZeRO's sharding
// (plan_from), and the text (MemoryPlan::describe, against). The public face is
// include/mpiddp/memory_plan.hpp; Trainer::plan_memory() and fit() call plan_run().
#pragma once

#include <mpiddp/data.hpp>
#include <mpiddp/ddp.hpp>
#include <mpiddp/memory_plan.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/process_group.hpp>
#include <mpiddp/trainer.hpp>

#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "zero/model_sharding.hpp"

namespace mpiddp::detail {

struct PlanInputs {
  int64_t resident = 0;         ///< this process's resident memory when planned (the model made)
  int64_t model_bytes = 0;      ///< parameters and buffers, each tensor once
  int64_t model_resident = -1;  ///< what `resident` holds of them (-1: all; a deferred model's: none of its units')
  int64_t trainable_bytes = 0;  ///< the parameters the optimizer steps
  int64_t largest_tensor = 0;   ///< bytes of the largest parameter or buffer
  std::vector<int64_t> units;   ///< each sharded unit's trainable bytes, in any order (none: the model whole)
  bool prefetch = true;         ///< ZeRO stage 3: ZeroOptions::prefetch
  bool reshard_after_forward = true;  ///< ZeRO stage 3: ZeroOptions::reshard_after_forward
  int world = 1;
  int zero_stage = 0;
  std::vector<int64_t> buckets;  ///< each gradient bucket's bytes, as DDP assigns them
  /// What the backend holds beside a bucket of this many bytes while reduce-scattering it (empty: nothing).
  std::function<int64_t(int64_t)> reduce_scatter_scratch;
  int state_fields = 0;  ///< optimizer state tensors per parameter element (Adam 2, SGD+momentum 1)
  bool snapshots = false;
  bool snapshot_through_rank_zero = false;  ///< small states: rank 0 writes what the others send
  int64_t activations = 0;                  ///< a micro-batch's activations and backward's working memory (probed)
};

/// The rule: each part by what it is and how ZeRO shards it.
MemoryPlan plan_from(const PlanInputs& in);

/// What the plan reads of a run.
struct PlannedRun {
  const Model& model;
  const ModelSharding& sharding;
  const torch::optim::Optimizer& optimizer;
  const TrainerOptions& options;
  ProcessGroup& pg;
  const SampleSet& train;  ///< the probe's micro-batch: its first batch_size samples
  /// The loss of a micro-batch (the Trainer's forward, under its precision).
  std::function<torch::Tensor(const Example& batch)> loss;
};

/// What the process held before the run's communication was made, and how much of it the model's
/// tensors (those with memory: a deferred model's units have none).
struct ResidentBeforeRun {
  int64_t process = 0;
  int64_t model = 0;
};
ResidentBeforeRun resident_before_run(const Model& model);

/// The plan of `run`, communicating through `ddp` and with `before` taken before `ddp` was made (the
/// process's own memory; the run's buffers, slices and shards are counted by their rules). Its
/// activations are measured by one forward and backward on the CPU (0 off it), through the units'
/// gathering where the model is sharded, without reducing (no_sync), after which the random
/// generator, the buffers and the gradients it moved are put back: training is unchanged.
/// Collective where the model is sharded.
MemoryPlan plan_run(const PlannedRun& run, DistributedDataParallel& ddp, const ResidentBeforeRun& before);

/// Holds the CPU generator's state and puts it back when it goes (the probe's draws, and deferred
/// initialisation's when only planned).
class CpuGeneratorGuard {
 public:
  CpuGeneratorGuard();
  ~CpuGeneratorGuard();
  CpuGeneratorGuard(const CpuGeneratorGuard&) = delete;
  CpuGeneratorGuard& operator=(const CpuGeneratorGuard&) = delete;

 private:
  torch::Tensor state_;
};

/// Holds a copy of an optimizer's state and puts it back when it goes (a plan made apart from a run:
/// ZeRO takes the state into its shards, and a run that ends leaves none).
class OptimizerStateGuard {
 public:
  explicit OptimizerStateGuard(torch::optim::Optimizer& optimizer);
  ~OptimizerStateGuard();
  OptimizerStateGuard(const OptimizerStateGuard&) = delete;
  OptimizerStateGuard& operator=(const OptimizerStateGuard&) = delete;

 private:
  torch::optim::Optimizer& optimizer_;
  std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())> saved_;
};

}  // namespace mpiddp::detail
