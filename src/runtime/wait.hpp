// How a rank waits for a non-blocking operation (a collective's request, a message): the one policy
// for every wait with a timeout. Spin first (small messages finish in microseconds, and MPI's
// non-blocking collectives progress only inside MPI_Test), read the clock only every
// kPollsPerClockRead polls (a clock read costs more than a poll of a short collective), yield after
// kSpinPolls so a waiting rank does not starve the rank it waits for on an oversubscribed node, and
// sleep only once the wait is long (a late rank, not a slow transfer).
#pragma once

#include <chrono>
#include <thread>

namespace mpiddp::detail {

constexpr int kPollsPerClockRead = 64;
constexpr int kSpinPolls = 1000;
constexpr auto kSleepAfter = std::chrono::milliseconds(100);
constexpr auto kSleepBetweenPolls = std::chrono::microseconds(50);

/// Polls `done()` until it returns true. `waited(elapsed)` is called at every clock read with the
/// time since `start` and may throw to end the wait (a timeout).
template <class Done, class Waited>
void wait_until(Done&& done, std::chrono::steady_clock::time_point start, Waited&& waited) {
  for (int polls = 1; !done(); ++polls) {
    if (polls % kPollsPerClockRead != 0) continue;
    const auto elapsed = std::chrono::steady_clock::now() - start;
    waited(elapsed);
    if (elapsed > kSleepAfter) {
      std::this_thread::sleep_for(kSleepBetweenPolls);
    } else if (polls > kSpinPolls) {
      std::this_thread::yield();
    }
  }
}

}  // namespace mpiddp::detail
