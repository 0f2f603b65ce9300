#include "runtime/child_process.hpp"

#include <mpiddp/error.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace mpiddp::detail {
namespace {

constexpr auto kGraceAfterSigterm = std::chrono::seconds(10);
constexpr int kForwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGCONT};

// The child the handler passes signals to (one child per process: launch's).
std::atomic<pid_t> forward_to{-1};
std::atomic<int> ending_signal{0};  // the last SIGTERM, SIGINT or SIGHUP passed on

extern "C" void pass_on(int signal) {
  const pid_t pid = forward_to.load();
  if (pid > 0) ::kill(pid, signal);  // async-signal-safe
  if (signal == SIGTERM || signal == SIGINT || signal == SIGHUP) ending_signal.store(signal);
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::string ChildExit::text() const {
  if (signal == 0) return "exited with status " + std::to_string(status);
  return "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& environment) {
  MPIDDP_CHECK(!argv.empty(), "no command to run");
  auto args = c_strings(argv);
  auto env = c_strings(environment);
  // The exec's failure comes back through a pipe that a successful exec closes (O_CLOEXEC).
  int report[2];
  MPIDDP_CHECK(::pipe2(report, O_CLOEXEC) == 0, std::string("cannot make a pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    const int e = errno;
    ::close(report[0]);
    ::close(report[1]);
    MPIDDP_THROW("cannot start '" + argv[0] + "': fork: " + std::strerror(e));
  }
  if (pid_ == 0) {  // the child: only async-signal-safe calls until exec
    ::close(report[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    ::execvpe(args[0], args.data(), env.data());
    const int e = errno;
    (void)!::write(report[1], &e, sizeof e);
    ::_exit(127);
  }
  ::close(report[1]);
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(report[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  ::close(report[0]);
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    wait();
    MPIDDP_THROW("cannot run '" + argv[0] + "': " + std::strerror(exec_errno));
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0 || reaped_) return;
  // Not waited for (an error on the way): it ends with us. SIGTERM first, as torchrun does; a
  // command that ignores it (a handler that only sets a flag) is killed after a grace period.
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + kGraceAfterSigterm;
  int raw = 0;
  while (::waitpid(pid_, &raw, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &raw, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (forward_to.load() == pid_) forward_to.store(-1);
}

void ChildProcess::forward_signals() {
  forward_to.store(pid_);
  struct sigaction a {};
  a.sa_handler = pass_on;
  sigemptyset(&a.sa_mask);
  a.sa_flags = SA_RESTART;
  for (int s : kForwarded) ::sigaction(s, &a, nullptr);
}

ChildExit ChildProcess::wait() {
  int raw = 0;
  while (::waitpid(pid_, &raw, 0) < 0) {
    if (errno != EINTR) MPIDDP_THROW(std::string("waiting for the command: ") + std::strerror(errno));
  }
  reaped_ = true;
  if (forward_to.load() == pid_) {
    forward_to.store(-1);
    for (int s : kForwarded) ::signal(s, SIG_DFL);
  }
  ChildExit e;
  if (WIFSIGNALED(raw)) e.signal = WTERMSIG(raw);
  if (WIFEXITED(raw)) e.status = WEXITSTATUS(raw);
  return e;
}

int ChildProcess::ending_signal_passed_on() { return ending_signal.load(); }

void ChildProcess::signal(int signal) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, signal);
}

}  // namespace mpiddp::detail
