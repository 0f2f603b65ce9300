// The communication's options: the timeout and stall watching that every blocking call applies
// (the runtime's watchdog and stall monitor: MPI calls and the process groups' collectives alike),
// the collectives' descriptor check, the mpi backend's staging. Read from the environment once.
#pragma once

#include <chrono>

namespace mpiddp {

struct CommOptions {
  /// Longest a collective may take before CollectiveTimeout. Environment: MPIDDP_COMM_TIMEOUT (s).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  /// Descriptor exchange before each collective (see above). Environment: MPIDDP_CHECK_COLLECTIVES=1.
  bool check_collectives = false;
  /// A wait in one collective longer than this logs, on every waiting rank, which ranks are
  /// behind and where (again every such period); zero: no warnings. The timeout error names the
  /// stalled ranks either way. Environment: MPIDDP_STALL_WARNING (s, 0 = no warnings).
  std::chrono::milliseconds stall_warning{std::chrono::seconds(60)};
  /// The stall monitor itself (warnings and the naming at the timeout); MPIDDP_STALL_WARNING=off
  /// turns it off: no notices are ever sent, and a timeout says only that it happened.
  bool stall_monitor = true;
  /// mpi backend: copy every tensor through host memory around the collective, as it does for
  /// CUDA tensors when the MPI library is not CUDA-aware; for an MPI whose CUDA support
  /// misbehaves, and for tests of the staged path on CPU tensors. Other backends ignore it.
  bool stage_through_host = false;

  /// Defaults overridden by the environment variables named above.
  static CommOptions from_environment();
};

}  // namespace mpiddp
