// `mpiddp launch`'s rules (src/app/launch.hpp) against the contract they implement: torchrun's
// variable names and values, where options end, which of rank 0's addresses a node dials, what
// the worker's environment keeps; and the child process it runs (src/runtime/child_process.hpp).
#include <gtest/gtest.h>

#include <mpiddp/error.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "app/launch.hpp"
#include "runtime/child_process.hpp"

using namespace mpiddp::app;

namespace {

uint32_t ip(int a, int b, int c, int d) {
  return (uint32_t(a) << 24) | (uint32_t(b) << 16) | (uint32_t(c) << 8) | uint32_t(d);
}
const uint32_t kSlash24 = ip(255, 255, 255, 0);

}  // namespace

TEST(Launch, OptionsEndAtTheDoubleDashOrTheFirstWord) {
  const std::set<std::string> values = {"--master-addr", "--store"};
  auto s = split_launch_args({"--print-env", "--store", "launcher", "--", "python", "-u", "t.py"}, values);
  EXPECT_EQ(s.options, (std::vector<std::string>{"--print-env", "--store", "launcher"}));
  EXPECT_EQ(s.command, (std::vector<std::string>{"python", "-u", "t.py"}));
  s = split_launch_args({"--master-addr", "10.0.0.1", "python", "--lr", "1"}, values);
  EXPECT_EQ(s.options, (std::vector<std::string>{"--master-addr", "10.0.0.1"}));
  EXPECT_EQ(s.command, (std::vector<std::string>{"python", "--lr", "1"}));
  s = split_launch_args({"--store=worker", "--", "--weird-name"}, values);
  EXPECT_EQ(s.options, (std::vector<std::string>{"--store=worker"}));
  EXPECT_EQ(s.command, (std::vector<std::string>{"--weird-name"}));
  EXPECT_TRUE(split_launch_args({"--print-env"}, values).command.empty());
}

TEST(Launch, TorchrunsContract) {
  WorkerContract c;
  c.topology = {5, 8, 1, 4, 1, 2};  // rank 5 of 8, local 1 of 4, node 1 of 2
  c.master_addr = "10.1.2.3";
  c.master_port = 41234;
  c.run_id = "777";
  EnvPairs want = {{"RANK", "5"},
                   {"WORLD_SIZE", "8"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "4"},
                   {"GROUP_RANK", "1"},
                   {"GROUP_WORLD_SIZE", "2"},
                   {"ROLE_NAME", "default"},
                   {"ROLE_RANK", "5"},
                   {"ROLE_WORLD_SIZE", "8"},
                   {"MASTER_ADDR", "10.1.2.3"},
                   {"MASTER_PORT", "41234"},
                   {"TORCHELASTIC_RUN_ID", "777"},
                   {"TORCHELASTIC_RESTART_COUNT", "0"},
                   {"TORCHELASTIC_MAX_RESTARTS", "0"}};
  EXPECT_EQ(torchrun_environment(c), want);
  c.store = StoreHost::kLauncher;  // torch/distributed/rendezvous.py compares with str(True)
  want.emplace_back("TORCHELASTIC_USE_AGENT_STORE", "True");
  EXPECT_EQ(torchrun_environment(c), want);
}

TEST(Launch, WorkerEnvironmentReplacesSetsAndKeepsTheJobsDefaults) {
  const std::vector<std::string> base = {"PATH=/bin", "RANK=99", "OMP_NUM_THREADS=7", "X=a=b"};
  const auto env = worker_environment(base, {{"RANK", "0"}, {"MASTER_PORT", "5"}},
                                      {{"OMP_NUM_THREADS", "2"}, {"GLOO_SOCKET_IFNAME", "eth1"}});
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/bin", "OMP_NUM_THREADS=7", "X=a=b", "RANK=0", "MASTER_PORT=5",
                                           "GLOO_SOCKET_IFNAME=eth1"}));
}

TEST(Launch, RankZerosInterfaceThatEveryNodeReaches) {
  const Ipv4Interface docker{"docker0", ip(172, 17, 0, 1), ip(255, 255, 0, 0)};
  const Ipv4Interface wlan{"wlan0", ip(192, 168, 1, 10), kSlash24};
  const Ipv4Interface ib{"ib0", ip(10, 77, 0, 11), kSlash24};
  const std::vector<Ipv4Interface> rank0 = {docker, wlan, ib};
  const std::vector<Ipv4Interface> node2 = {{"docker0", ip(172, 17, 0, 1), ip(255, 255, 0, 0)},
                                            {"eth0", ip(172, 16, 0, 5), kSlash24},
                                            {"ib1", ip(10, 77, 0, 12), kSlash24}};
  // Rank 0's node reaches all of its own; the other node neither the bridge it holds too nor the
  // wlan it is not on: the job's choice is ib0, named ib0 there and ib1 here.
  const uint64_t node1_bits = reachable_rank0_interfaces(rank0, rank0, true);
  const uint64_t node2_bits = reachable_rank0_interfaces(rank0, node2, false);
  EXPECT_EQ(node1_bits, 0b111u);
  EXPECT_EQ(node2_bits, 0b100u);
  const auto common = first_interface(node1_bits & node2_bits);
  ASSERT_TRUE(common);
  EXPECT_EQ(ipv4_text(rank0[*common].address), "10.77.0.11");
  EXPECT_EQ(interface_towards(rank0[*common], rank0), "ib0");
  EXPECT_EQ(interface_towards(rank0[*common], node2), "ib1");
  EXPECT_FALSE(first_interface(reachable_rank0_interfaces(rank0, {{"eth0", ip(172, 16, 0, 5), kSlash24}}, false)));
  EXPECT_FALSE(first_interface(reachable_rank0_interfaces({}, node2, false)));
}

TEST(Launch, AReservedPortIsHeldYetAStoreCanListenOnIt) {
  const ReservedPort reserved;
  ASSERT_GT(reserved.port(), 0);
  const auto bind_to = [&](int family, bool reuse, bool listen) {
    const int fd = ::socket(family, SOCK_STREAM, 0);
    if (fd < 0) return -2;  // no such family here
    const int on = 1;
    if (reuse) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    int rc;
    if (family == AF_INET) {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(reserved.port()));
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;  // dual stack, as libuv's store binds
      a.sin6_port = htons(static_cast<uint16_t>(reserved.port()));
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc == 0 && listen) rc = ::listen(fd, 4);
    const int err = rc == 0 ? 0 : errno;
    ::close(fd);
    return err;
  };
  EXPECT_EQ(bind_to(AF_INET, false, false), EADDRINUSE);  // held: nothing else is given it
  EXPECT_EQ(bind_to(AF_INET, true, true), 0);             // a store (SO_REUSEADDR) listens on it
  const int v6 = bind_to(AF_INET6, true, true);
  if (v6 != -2) {  // -2: no IPv6 socket here
    EXPECT_EQ(v6, 0);
  }
}

TEST(ChildProcess, RunsWithItsEnvironmentAndReportsHowItEnded) {
  mpiddp::detail::ChildProcess ok({"sh", "-c", "[ \"$RANK\" = 3 ] && [ -z \"$HOME\" ]"},
                                  {"RANK=3", "PATH=/usr/bin:/bin"});
  EXPECT_TRUE(ok.wait().ok());
  mpiddp::detail::ChildProcess fails({"sh", "-c", "exit 3"}, {"PATH=/usr/bin:/bin"});
  const auto f = fails.wait();
  EXPECT_EQ(f.shell_status(), 3);
  EXPECT_EQ(f.text(), "exited with status 3");
  mpiddp::detail::ChildProcess killed({"sh", "-c", "kill -9 $$"}, {"PATH=/usr/bin:/bin"});
  const auto k = killed.wait();
  EXPECT_EQ(k.shell_status(), 128 + SIGKILL);
  EXPECT_NE(k.text().find("killed by signal 9"), std::string::npos);
}

TEST(ChildProcess, ACommandThatCannotStartIsOneLine) {
  try {
    mpiddp::detail::ChildProcess missing({"/no/such/command"}, {});
    FAIL() << "started";
  } catch (const mpiddp::Error& e) {
    EXPECT_EQ(e.message(), "cannot run '/no/such/command': No such file or directory");
  }
}
