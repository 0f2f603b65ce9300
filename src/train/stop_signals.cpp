#include "train/stop_signals.hpp"

#include <signal.h>

#include <csignal>

namespace mpiddp::detail {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void record_stop_signal(int signo) { g_stop_signal = signo; }
}  // namespace

struct StopSignals::Saved {
  struct sigaction term {};
  struct sigaction usr1 {};
};

StopSignals::StopSignals(bool enabled) : enabled_(enabled), saved_(new Saved) {
  g_stop_signal = 0;
  if (!enabled_) return;
  struct sigaction sa {};
  sa.sa_handler = record_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &saved_->term);
  sigaction(SIGUSR1, &sa, &saved_->usr1);
}

StopSignals::~StopSignals() {
  if (enabled_ && g_stop_signal == 0) {
    sigaction(SIGTERM, &saved_->term, nullptr);
    sigaction(SIGUSR1, &saved_->usr1, nullptr);
  }
  delete saved_;
}

int StopSignals::pending() { return static_cast<int>(g_stop_signal); }
void StopSignals::stopping(int signo) { g_stop_signal = static_cast<std::sig_atomic_t>(signo); }

const char* signal_name(int signo) {
  switch (signo) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace mpiddp::detail
