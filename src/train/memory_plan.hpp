// The memory plan's rule (include/mpiddp/memory_plan.hpp) from what the Trainer knows and measures.
#pragma once

#include <mpiddp/memory_plan.hpp>

#include <cstdint>
#include <functional>
#include <vector>

namespace mpiddp::detail {

struct PlanInputs {
  int64_t resident = 0;            ///< this process's resident memory when planned (the model made)
  int64_t model_bytes = 0;         ///< parameters and buffers, each tensor once
  int64_t model_resident = -1;     ///< what `resident` holds of them (-1: all; a deferred model's: none of its units')
  int64_t trainable_bytes = 0;     ///< the parameters the optimizer steps
  int64_t largest_tensor = 0;      ///< bytes of the largest parameter or buffer
  std::vector<int64_t> units;      ///< ZeRO stage 3: each unit's trainable bytes (sharded), in any order
  bool prefetch = true;            ///< ZeRO stage 3: ZeroOptions::prefetch
  bool reshard_after_forward = true;  ///< ZeRO stage 3: ZeroOptions::reshard_after_forward
  int world = 1;
  int zero_stage = 0;
  int64_t bucket_cap = 0;          ///< the gradient buckets' cap in force (stage 3's units: one bucket each whatever it)
  /// What the backend holds beside a bucket of this many bytes while reduce-scattering it (empty: nothing).
  std::function<int64_t(int64_t)> reduce_scatter_scratch;
  int state_fields = 0;            ///< optimizer state tensors per parameter element (Adam 2, SGD+momentum 1)
  bool snapshots = false;
  bool snapshot_through_rank_zero = false;  ///< small states: rank 0 writes what the others send
  int64_t activations = 0;         ///< a micro-batch's activations and backward's working memory (probed)
};

MemoryPlan plan_memory(const PlanInputs& in);


}  // namespace mpiddp::detail
