// The memory plan's rule: each part by what it is and how ZeRO shards it.
#include "train/memory_plan.hpp"

#include <algorithm>

#include "snapshot/parallel_snapshot.hpp"

namespace mpiddp::detail {

MemoryPlan plan_memory(const PlanInputs& in) {
  MemoryPlan plan;
  // Stage 3 keeps 1/N of its units' parameters, and the units gathered at the moment whole.
  plan.parameters = in.zero_stage == 3 ? in.model_bytes - in.unit_bytes + (in.unit_bytes + in.world - 1) / in.world +
                                             in.gathered_unit_bytes
                                       : in.model_bytes;
  plan.process = std::max<int64_t>(0, in.resident - in.model_bytes);
  const int64_t shard = (in.trainable_bytes + in.world - 1) / in.world;
  // Stages 2-3 keep the owned slice of each averaged bucket; a bucket being filled and one being
  // reduce-scattered are whole.
  plan.gradients = in.zero_stage >= 2 ? shard + std::min(in.trainable_bytes, 2 * in.bucket_cap) : in.trainable_bytes;
  plan.optimizer_state = in.state_fields * (in.zero_stage >= 1 ? shard : in.trainable_bytes);
  plan.activations = in.activations;
  if (in.snapshots) {
    // Rank 0 holds each part the others send, one tensor at a time; MPI-IO's collective buffer
    // is 16 MiB (ROMIO's and OMPIO's cb_buffer_size).
    plan.snapshot_buffers = in.snapshot_through_rank_zero ? in.largest_tensor : kParallelIoFromBytes;
  }
  return plan;
}

}  // namespace mpiddp::detail
