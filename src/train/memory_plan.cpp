// The memory plan's rule: each part by what it is and how ZeRO shards it.
#include "train/memory_plan.hpp"

#include <algorithm>

#include <mpiddp/ddp.hpp>

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
  plan.gradients = in.trainable_bytes;
  if (in.zero_stage >= 2) {
    // The owned slice of each averaged bucket; whole, at worst the largest buckets: one being
    // filled and those being reduce-scattered (DDP bounds them), these with what the backend holds
    // while reducing them.
    plan.gradients = shard;
    for (size_t k = 0; k < in.largest_buckets.size() && k <= kTransientBuffersInFlight; ++k) {
      plan.gradients += in.largest_buckets[k];
    }
    for (size_t k = 0; k < in.reduce_scatter_scratch.size() && k < kTransientBuffersInFlight; ++k) {
      plan.gradients += in.reduce_scatter_scratch[k];
    }
  }
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
