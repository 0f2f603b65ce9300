// Runs a function in a forked child under an alarm, so that a crash or a hang is an outcome to
// count and name instead of the end of the test (the corruption sweeps).
#pragma once

#include <mpiddp/error.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <functional>
#include <string>

namespace mpiddp::testing {

constexpr unsigned kCaseSeconds = 20;  // a case still running after this is a hang

struct Outcome {
  enum { kAccepted, kCleanError, kOtherException, kCrashed, kHung } what;
  std::string detail;  // the error line, or the signal
};

// Runs `read` on `bytes` in a forked child: exit 0 = accepted, 3 = mpiddp::Error (message sent
// back through a pipe), 4 = another exception; killed by SIGALRM = hung; any other signal = crash.
inline Outcome run_isolated(const std::function<void()>& read) {
  int fds[2];
  if (pipe(fds) != 0) return {Outcome::kOtherException, "pipe failed"};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    alarm(kCaseSeconds);
    int code = 0;
    std::string message;
    try {
      read();
    } catch (const mpiddp::Error& e) {
      code = 3, message = e.message();
    } catch (const std::exception& e) {
      code = 4, message = e.what();
    }
    if (!message.empty()) (void)!write(fds[1], message.data(), message.size());
    close(fds[1]);
    _exit(code);  // no destructors, no atexit: the child only reports
  }
  close(fds[1]);
  std::string message;
  char buf[4096];
  ssize_t got;
  while ((got = ::read(fds[0], buf, sizeof buf)) > 0) message.append(buf, static_cast<size_t>(got));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return {sig == SIGALRM ? Outcome::kHung : Outcome::kCrashed, strsignal(sig)};
  }
  switch (WEXITSTATUS(status)) {
    case 0:
      return {Outcome::kAccepted, ""};
    case 3:
      return {Outcome::kCleanError, message};
    default:
      return {Outcome::kOtherException, message};
  }
}

}  // namespace mpiddp::testing
