// EpochClock: an epoch's training time, without the snapshots written during it (fit() takes a lap
// before a snapshot and restarts after it). Local: each rank times itself; the epoch's record
// reports rank 0's.
#pragma once

#include <chrono>

namespace mpiddp::detail {

class EpochClock {
 public:
  /// Seconds since the start or the last lap, and a new lap starts.
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - since_).count();
    since_ = now;
    return s;
  }
  /// A new lap starts now (the time since the last lap is not counted).
  void restart() { since_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
};

}  // namespace mpiddp::detail
