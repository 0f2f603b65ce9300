// SIGTERM (Slurm's preemption, scancel) and SIGUSR1 (`sbatch --signal=USR1@T`) ask training to stop
// at the next step boundary, where every rank learns every rank's pending signal.
#pragma once

namespace mpiddp::detail {

/// Installs the handlers for its lifetime (when `enabled`). The old handlers come back only if no
/// such signal came: after one did, the process is on its way out, and a second copy (Slurm signals
/// every task, launchers forward theirs) must not kill a rank that already stopped cleanly.
class StopSignals {
 public:
  explicit StopSignals(bool enabled);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  /// The signal received since construction (0: none).
  static int pending();
  /// Records that this rank stops for `signo` (another rank's signal), as if it had come here.
  static void stopping(int signo);

 private:
  bool enabled_;
  struct Saved;
  Saved* saved_;
};

const char* signal_name(int signo);

}  // namespace mpiddp::detail
