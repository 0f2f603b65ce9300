#include "train/step_profiler.hpp"

#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/timeline.hpp>

#include "common/text.hpp"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <unistd.h>
#include <filesystem>
#include <iostream>
#include <set>

namespace mpiddp::detail {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::set<ActivityType> profiled_activities(bool cuda) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (cuda) a.insert(ActivityType::CUDA);
  return a;
}

// Kineto must be prepared before each session: a session uses its preparation up (a second
// enableProfiler without one crashed libkineto at the session's end, on CUDA).
void start_session(bool cuda) {
  kineto::prepareProfiler(ProfilerConfig(ProfilerState::KINETO), profiled_activities(cuda));
  kineto::enableProfiler(ProfilerConfig(ProfilerState::KINETO), profiled_activities(cuda));
}

}  // namespace

StepProfiler::StepProfiler(const TrainerOptions& options, int rank)
    : path_(options.profile_path.empty() ? "" : Timeline::rank_path(options.profile_path, rank)),
      first_(options.profile_first_step),
      end_(options.profile_first_step + options.profile_steps),
      cuda_(options.device.is_cuda()) {
  if (path_.empty()) return;
  // A libtorch built without Kineto (USE_KINETO=0: Debian's 1.13) starts and stops the profiler but
  // cannot save a trace: an empty session saved to a scratch file finds out now, alike on every
  // rank (the same libtorch), instead of at the window's end.
  const auto scratch =
      std::filesystem::temp_directory_path() / ("mpiddp-profile-probe-" + std::to_string(::getpid()) + ".json");
  try {
    start_session(cuda_);
    kineto::disableProfiler()->save(scratch.string());
    std::filesystem::remove(scratch);
  } catch (const std::exception& e) {
    std::error_code ignored;
    std::filesystem::remove(scratch, ignored);
    MPIDDP_THROW_AGREED(
        std::string("--profile needs libtorch's profiler with Kineto (USE_KINETO=1), which this libtorch ") +
        compat::torch_version() + " cannot use: " + reason_of(e));
  }
}

StepProfiler::~StepProfiler() {
  try {
    finish();
  } catch (...) {  // finish() reports its own failures; a destructor never throws
  }
}

void StepProfiler::before_step(int64_t steps_done) {
  if (path_.empty() || on_ || steps_done < first_ || steps_done >= end_) return;
  start_session(cuda_);
  on_ = true;
}

std::string StepProfiler::after_step(int64_t steps_done) { return steps_done >= end_ ? finish() : ""; }

std::string StepProfiler::finish() {
  if (!on_) return "";
  on_ = false;
  try {
    if (cuda_) torch::cuda::synchronize();  // the window's kernels, not only those already done
    kineto::disableProfiler()->save(path_);
    MPIDDP_CHECK(std::filesystem::exists(path_), "nothing was written");
    return path_;
  } catch (const std::exception& e) {
    std::cerr << "mpiddp: warning: profile '" << path_ << "' not written: " << reason_of(e) << std::endl;
    return "";
  }
}

}  // namespace mpiddp::detail
