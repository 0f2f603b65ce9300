// Internal: names the ranks a stalled collective waits for: the process groups' collectives (in
// normal runs; check mode names late ranks itself) and the Runtime's own on its world
// communicator (runtime.hpp's CollectiveStep), each over a monitor of its own.
//
// A rank whose wait in a collective has lasted MPIDDP_STALL_WARNING seconds announces it to every
// peer on the group's control communicator: a small notice {sequence number, description}, sent
// with MPI_Isend so a peer that never reads it (stopped, hung, dead) cannot block the sender. The
// ranks that announced a wait in the same collective have arrived; the rest are behind, and a
// notice from a rank waiting in another collective says where it is. Nothing is sent or polled
// until a wait grows long, so a healthy run pays one clock comparison per clock read it already
// makes. Not thread-safe: a group's collectives are waited on from one thread.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mpiddp::detail {

/// A wait as the monitor knows it: the collective's sequence number among those of the monitor's
/// ranks (every rank numbers them alike) and how to describe it.
struct WaitSite {
  uint64_t seq = 0;
  std::function<std::string()> describe;  ///< "allreduce #7 (float32[1031], sum)"
};

class StallMonitor {
 public:
  /// `control` is a communicator of the group's ranks reserved for notices (not freed here);
  /// `warning`: how long a wait lasts before it is logged (zero: never).
  StallMonitor(MPI_Comm control, int rank, int size, std::chrono::milliseconds warning);
  ~StallMonitor();
  StallMonitor(const StallMonitor&) = delete;
  StallMonitor& operator=(const StallMonitor&) = delete;

  /// Announces (once per collective) that this rank waits in `site`, reads the notices that have
  /// come in, and says who is behind: "rank 2 has not reached it (ranks 0,1 wait in it)".
  std::string behind(const WaitSite& site);
  /// behind() at a timeout in `site`: peers time out at about the same moment, so they get a few
  /// seconds to announce their own wait first (the warning may not have gone out yet).
  std::string behind_at_timeout(const WaitSite& site);
  /// Called by a wait in `site` that has lasted `waited`: every `warning` of it, logs on stderr
  /// "mpiddp: warning: [rank R] <site> has waited N s: <behind()>".
  void on_wait(const WaitSite& site, std::chrono::steady_clock::duration waited);
  /// Called when a wait in `site` completes: if this rank announced it, says it has moved on (a
  /// later wait in the same collective announces and warns afresh).
  void on_done(const WaitSite& site) {
    if (announced_ == site.seq && !resolved_) resolve();
  }
  /// Whether this rank reports a timeout in `site`: the lowest rank known to wait in any collective
  /// does, so that the job's log holds one error line.
  bool reports_timeout(const WaitSite& site);

 private:
  struct Notice {
    uint64_t seq = 0;     ///< 0: nothing heard
    int32_t waiting = 0;  ///< 1: waits in `seq`; 0: its wait there has ended
    char what[116] = {};
  };
  void announce(const WaitSite& site);
  void send(const Notice& notice);
  void drain();

  MPI_Comm comm_;
  int rank_, size_;
  std::vector<Notice> latest_;  ///< per rank, the newest wait it announced
  Notice inbox_;
  MPI_Request recv_ = MPI_REQUEST_NULL;
  struct Sent {
    std::unique_ptr<Notice> notice;
    std::vector<MPI_Request> requests;
  };
  std::deque<Sent> sent_;  ///< kept until delivered: a stopped peer may never take its copy
  void resolve();
  uint64_t announced_ = 0;
  bool resolved_ = false;
  std::chrono::milliseconds warning_;
  uint64_t warned_seq_ = 0;
  std::chrono::steady_clock::duration next_warning_{};
};

}  // namespace mpiddp::detail
