// The memory plan's rule (include/mpiddp/memory_plan.hpp) from what the Trainer knows and measures.
#pragma once

#include <mpiddp/memory_plan.hpp>

#include <cstdint>
#include <vector>

namespace mpiddp::detail {

struct PlanInputs {
  int64_t resident = 0;            ///< this process's resident memory when planned (the model made)
  int64_t model_bytes = 0;         ///< parameters and buffers, each tensor once
  int64_t trainable_bytes = 0;     ///< the parameters the optimizer steps
  int64_t largest_tensor = 0;      ///< bytes of the largest parameter or buffer
  int64_t unit_bytes = 0;          ///< ZeRO stage 3: the parameters of the model's units (sharded)
  int64_t gathered_unit_bytes = 0; ///< ZeRO stage 3: the units gathered at once at the peak
  int world = 1;
  int zero_stage = 0;
  /// Stages 2-3: the largest gradient buckets' bytes, largest first (1 + kTransientBuffersInFlight
  /// of them at most), and what the backend holds beside each while reduce-scattering it.
  std::vector<int64_t> largest_buckets, reduce_scatter_scratch;
  int state_fields = 0;            ///< optimizer state tensors per parameter element (Adam 2, SGD+momentum 1)
  bool snapshots = false;
  bool snapshot_through_rank_zero = false;  ///< small states: rank 0 writes what the others send
  int64_t activations = 0;         ///< a micro-batch's activations and backward's working memory (probed)
};

MemoryPlan plan_memory(const PlanInputs& in);

}  // namespace mpiddp::detail
