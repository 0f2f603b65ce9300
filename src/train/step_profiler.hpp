// StepProfiler: PyTorch's profiler (Kineto) over a window of global steps, written as one Chrome
// trace per rank (chrome://tracing, Perfetto): the host's operators and, on CUDA, each kernel and
// copy with its GPU time. Where --timeline shows DDP's phases as the host sees them, this shows
// what the device ran and where it waited.
#pragma once

#include <mpiddp/trainer.hpp>

#include <cstdint>
#include <string>

namespace mpiddp::detail {

class StepProfiler {
 public:
  /// Disabled when options.profile_path is empty. Enabled, it warms the profiler up now (so that
  /// a libtorch built without Kineto fails here, before training, on every rank alike).
  StepProfiler(const TrainerOptions& options, int rank);
  ~StepProfiler();  ///< a window still open (an exception, or fewer steps than the window) is written
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  /// Before the step that follows `steps_done` global steps: starts at the window's first.
  void before_step(int64_t steps_done);
  /// After a step: writes the trace once `steps_done` reaches the window's end. Returns the path
  /// written, else "". A trace that cannot be written is a warning on stderr, never an error:
  /// training goes on.
  std::string after_step(int64_t steps_done);
  /// Writes a window still open (the run ended inside it); the path, else "".
  std::string finish();

 private:
  std::string path_;  ///< this rank's
  int64_t first_ = 0, end_ = 0;
  bool cuda_ = false, on_ = false;
};

}  // namespace mpiddp::detail
