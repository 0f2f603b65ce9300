// The memory plan of a training run: what each rank is predicted to hold at its peak, by part,
// before the first step (Trainer::plan_memory, `mpiddp train` prints it; `--dry-run` prints it and
// trains nothing), and the peak each rank reached, measured after the first steps.
//   process          the process before the model: libtorch, MPI, the dataset cache (its resident
//                    memory before the run's DDP and ZeRO were made, less the model's tensors)
//   parameters       parameters and buffers (ZeRO 3: the units' 1/N, plus the units gathered at
//                    once: the two largest with prefetch, one without, all with reshard_after_forward off)
//   gradients        one per trainable element (ZeRO 2-3: the owned 1/N, and at worst the largest
//                    buckets whole: one being filled, two being reduce-scattered with what the
//                    backend holds for each meanwhile)
//   optimizer_state  per element: Adam/AdamW 2 fields (AMSGrad 3), SGD with momentum 1 (ZeRO 1-3: 1/N)
//   activations      what one micro-batch's forward and backward add at their peak besides the
//                    gradients: the saved activations and backward's working memory (with
//                    activation checkpointing: the blocks' inputs and one block's recompute),
//                    measured by running them once (RNG, buffers and gradients put back: training
//                    is unchanged); the peak resident mark is reset before it
//   snapshot_buffers what writing a snapshot holds besides the tensors (the largest tensor where
//                    rank 0 writes for all; a 16 MiB verification piece where every rank writes)
#pragma once

#include <mpiddp/memory.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mpiddp {

struct MemoryPlan {
  int64_t process = 0;
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t activations = 0;
  int64_t snapshot_buffers = 0;

  int64_t peak() const { return process + parameters + gradients + optimizer_state + activations + snapshot_buffers; }
  /// "memory plan per rank: peak 812 MiB = process 210 + parameters 41 + ...".
  std::string describe() const;
  /// Each rank's measured peak (by rank) against the plan: "memory: measured peak 830 MiB per rank
  /// (rank 1; the least 801, rank 0) after 3 steps, 1.02 x the plan's 812 MiB".
  std::string against(const std::vector<int64_t>& rank_peaks, int64_t steps) const;
};

}  // namespace mpiddp
