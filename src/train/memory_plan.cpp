// The memory plan's rule: each part by what it is and how ZeRO shards it.
#include "train/memory_plan.hpp"

#include <algorithm>
#include <numeric>

#include <mpiddp/ddp.hpp>

#include "snapshot/parallel_snapshot.hpp"

namespace mpiddp::detail {

namespace {

// Stage 3's units, largest first (none below stage 3).
std::vector<int64_t> sharded_units(const PlanInputs& in) {
  std::vector<int64_t> units = in.zero_stage == 3 ? in.units : std::vector<int64_t>{};
  std::sort(units.rbegin(), units.rend());
  return units;
}

// Stage 3: the parameters and buffers a rank holds between units (its slices of the units', the rest whole).
int64_t sharded_model_bytes(const PlanInputs& in) {
  const auto units = sharded_units(in);
  const int64_t unit_bytes = std::accumulate(units.begin(), units.end(), int64_t{0});
  return in.model_bytes - unit_bytes + (unit_bytes + in.world - 1) / in.world;
}

// Stage 3 keeps the units gathered at the moment whole: the two largest with prefetch, one
// without, all when kept from forward to backward.
int64_t gathered_unit_bytes(const PlanInputs& in) {
  const auto units = sharded_units(in);
  const size_t gathered = std::min(units.size(), !in.reshard_after_forward ? units.size() : in.prefetch ? 2 : 1);
  return std::accumulate(units.begin(), units.begin() + static_cast<std::ptrdiff_t>(gathered), int64_t{0});
}

}  // namespace

MemoryPlan plan_memory(const PlanInputs& in) {
  MemoryPlan plan;
  const auto units = sharded_units(in);
  const int64_t unit_bytes = std::accumulate(units.begin(), units.end(), int64_t{0});
  // Stage 3 keeps 1/N of its units' parameters and the units gathered at the moment.
  plan.parameters = sharded_model_bytes(in) + gathered_unit_bytes(in);
  plan.process = std::max<int64_t>(0, in.resident - (in.model_resident >= 0 ? in.model_resident : in.model_bytes));
  const int64_t shard = (in.trainable_bytes + in.world - 1) / in.world;
  plan.gradients = in.trainable_bytes;
  if (in.zero_stage >= 2) {
    // The owned slice of each averaged bucket; whole, at worst the largest buckets: one being
    // filled and those being reduce-scattered (DDP bounds them), these with what the backend holds
    // while reducing them. The buckets: each unit one of its own whatever the cap, the other
    // parameters by the cap (the few largest of them suffice here).
    const size_t whole = kTransientBuffersInFlight + 1;
    const int64_t cap = std::max<int64_t>(1, in.bucket_cap), rest = in.trainable_bytes - unit_bytes;
    std::vector<int64_t> buckets = units;
    buckets.insert(buckets.end(), static_cast<size_t>(std::min<int64_t>(rest / cap, whole)), cap);
    if (rest % cap > 0) buckets.push_back(rest % cap);
    std::sort(buckets.rbegin(), buckets.rend());
    plan.gradients = shard;
    for (size_t k = 0; k < std::min(buckets.size(), whole); ++k) {
      plan.gradients += buckets[k];
      const bool reducing = k < kTransientBuffersInFlight;
      if (reducing && in.reduce_scatter_scratch) plan.gradients += in.reduce_scatter_scratch(buckets[k]);
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
