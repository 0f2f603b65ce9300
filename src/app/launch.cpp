#include "app/launch.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <mpiddp/error.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

namespace mpiddp::app {

LaunchArgs split_launch_args(const std::vector<std::string>& args, const std::set<std::string>& taking_values) {
  LaunchArgs out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.empty() || a[0] != '-') break;
    out.options.push_back(a);
    if (taking_values.count(a) && i + 1 < args.size()) out.options.push_back(args[++i]);
  }
  out.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return out;
}

std::vector<Ipv4Interface> ipv4_interfaces() {
  std::vector<Ipv4Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !i->ifa_netmask) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    Ipv4Interface f;
    f.name = i->ifa_name;
    f.address = ntohl(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    f.netmask = ntohl(reinterpret_cast<const sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr);
    out.push_back(f);
  }
  freeifaddrs(list);
  return out;
}

std::string ipv4_text(uint32_t address) {
  in_addr a{};
  a.s_addr = htonl(address);
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

namespace {
bool same_subnet(const Ipv4Interface& a, const Ipv4Interface& b) {
  return b.netmask != 0 && (a.address & b.netmask) == (b.address & b.netmask);
}
}  // namespace

uint64_t reachable_rank0_interfaces(const std::vector<Ipv4Interface>& rank0, const std::vector<Ipv4Interface>& mine,
                                    bool on_rank0s_node) {
  uint64_t bits = 0;
  for (size_t i = 0; i < rank0.size() && i < 64; ++i) {
    bool reached = false, held_here = false;
    for (const auto& ours : mine) {
      reached = reached || same_subnet(rank0[i], ours);
      held_here = held_here || ours.address == rank0[i].address;
    }
    if (reached && (on_rank0s_node || !held_here)) bits |= uint64_t{1} << i;
  }
  return bits;
}

std::optional<size_t> first_interface(uint64_t mask) {
  for (size_t i = 0; i < 64; ++i) {
    if (mask & (uint64_t{1} << i)) return i;
  }
  return std::nullopt;
}

std::string interface_towards(const Ipv4Interface& theirs, const std::vector<Ipv4Interface>& mine) {
  for (const auto& ours : mine) {
    if (ours.address == theirs.address) return ours.name;
  }
  for (const auto& ours : mine) {
    if (same_subnet(theirs, ours)) return ours.name;
  }
  return "";
}

ReservedPort::ReservedPort() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  MPIDDP_CHECK(fd_ >= 0, std::string("cannot reserve a port: socket: ") + std::strerror(errno));
  const int on = 1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
      ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int e = errno;
    ::close(fd_);
    MPIDDP_THROW(std::string("cannot reserve a port: ") + std::strerror(e));
  }
  port_ = ntohs(a.sin_port);
}

ReservedPort::~ReservedPort() {
  if (fd_ >= 0) ::close(fd_);
}

EnvPairs torchrun_environment(const WorkerContract& c) {
  const Topology& t = c.topology;
  const auto s = [](int v) { return std::to_string(v); };
  EnvPairs env = {{"RANK", s(t.rank)},
                  {"WORLD_SIZE", s(t.size)},
                  {"LOCAL_RANK", s(t.local_rank)},
                  {"LOCAL_WORLD_SIZE", s(t.local_size)},
                  {"GROUP_RANK", s(t.node_rank)},
                  {"GROUP_WORLD_SIZE", s(t.node_count)},
                  {"ROLE_NAME", "default"},
                  {"ROLE_RANK", s(t.rank)},
                  {"ROLE_WORLD_SIZE", s(t.size)},
                  {"MASTER_ADDR", c.master_addr},
                  {"MASTER_PORT", s(c.master_port)},
                  {"TORCHELASTIC_RUN_ID", c.run_id},
                  {"TORCHELASTIC_RESTART_COUNT", "0"},
                  {"TORCHELASTIC_MAX_RESTARTS", "0"}};
  if (c.store == StoreHost::kLauncher) env.emplace_back("TORCHELASTIC_USE_AGENT_STORE", "True");
  return env;
}

std::vector<std::string> worker_environment(const std::vector<std::string>& base, const EnvPairs& set,
                                            const EnvPairs& defaults) {
  const auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::set<std::string> replaced, present;
  for (const auto& [name, value] : set) replaced.insert(name);
  std::vector<std::string> out;
  for (const auto& entry : base) {
    const std::string name = name_of(entry);
    present.insert(name);
    if (!replaced.count(name)) out.push_back(entry);
  }
  for (const auto& [name, value] : set) out.push_back(name + "=" + value);
  for (const auto& [name, value] : defaults) {
    if (!present.count(name) && !replaced.count(name)) out.push_back(name + "=" + value);
  }
  return out;
}

}  // namespace mpiddp::app
