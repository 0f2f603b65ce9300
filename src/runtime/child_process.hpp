// One command run as this process's child (`mpiddp launch`): started with its own environment,
// told to end when this process dies, sent the signals this process receives, and waited for.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace mpiddp::detail {

/// How a child ended: its exit status, or the signal that killed it.
struct ChildExit {
  int status = 0;  ///< exit status (when signal is 0)
  int signal = 0;  ///< the signal that ended it, else 0
  bool ok() const { return signal == 0 && status == 0; }
  /// A shell's view of it: the status, or 128 + the signal.
  int shell_status() const { return signal ? 128 + signal : status; }
  /// "exited with status 3", "was killed by signal 9 (Killed)".
  std::string text() const;
};

class ChildProcess {
 public:
  /// Starts argv[0] (searched in PATH as a shell does) with exactly `environment` ("NAME=value"
  /// entries). The child gets SIGTERM when this process dies. Throws mpiddp::Error (one line) when
  /// the command cannot be started (not found, not executable).
  ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& environment);
  /// A child not waited for gets SIGTERM, and SIGKILL 10 s later if it still runs. Never throws.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// From now until wait() returns, SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2 and SIGCONT that
  /// reach this process are passed on to the child (a scheduler's preemption notice, scancel,
  /// mpirun's kill) instead of acting here.
  void forward_signals();
  /// Blocks until the child ends.
  ChildExit wait();
  /// The last SIGTERM, SIGINT or SIGHUP passed on to the child (0: none): the job is being ended
  /// from outside (scancel, mpirun's kill), and the child's death is no failure of its own.
  static int ending_signal_passed_on();
  /// Sends `signal` to the child, if it still runs.
  void signal(int signal);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace mpiddp::detail
