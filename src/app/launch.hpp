// `mpiddp launch`'s rules, as pure functions (the command is launch_command.cpp): where its own
// options end and the command begins, which address of rank 0 a node's workers dial, and the
// environment each worker gets (torchrun's contract).
#pragma once

#include <mpiddp/runtime.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace mpiddp::app {

/// `mpiddp launch [OPTIONS] [--] COMMAND ARGS...`: the options are the words before "--", or
/// before the first word that does not start with '-' (one of `taking_values`, given without
/// "=VALUE", takes the next word).
struct LaunchArgs {
  std::vector<std::string> options;
  std::vector<std::string> command;
};
LaunchArgs split_launch_args(const std::vector<std::string>& args, const std::set<std::string>& taking_values);

/// An IPv4 interface that is up and not the loopback (address and netmask in host byte order).
struct Ipv4Interface {
  std::string name;
  uint32_t address = 0;
  uint32_t netmask = 0;
};
std::vector<Ipv4Interface> ipv4_interfaces();
std::string ipv4_text(uint32_t address);

/// Which of rank 0's interfaces (at most 64) a node can use to reach rank 0: bit i for rank0[i] when
/// one of `mine` is on its subnet (reached without a router, whatever names resolve to) and, on
/// another node than rank 0's, its address is not one of `mine` (a bridge every node has, such as
/// docker0, holds the same address everywhere and leads nowhere). The job uses the first interface
/// every node can (the AND of every rank's bits).
uint64_t reachable_rank0_interfaces(const std::vector<Ipv4Interface>& rank0, const std::vector<Ipv4Interface>& mine,
                                    bool on_rank0s_node);
/// The lowest bit set in `mask` (nullopt: none).
std::optional<size_t> first_interface(uint64_t mask);
/// The name of this node's interface towards `theirs`: the one holding its address, else the first on
/// its subnet ("" when none is).
std::string interface_towards(const Ipv4Interface& theirs, const std::vector<Ipv4Interface>& mine);

/// A TCP port the kernel picked, held bound (SO_REUSEADDR, not listening) so that nothing else is
/// given it, while a worker's store may still bind and listen on it (SO_REUSEADDR there too, as
/// c10d's TCPStore and libuv set it): the port race of hand-made MASTER_PORTs closed. Throws
/// mpiddp::Error when no port can be had.
class ReservedPort {
 public:
  ReservedPort();
  ~ReservedPort();
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

/// Who serves the workers' rendezvous store: rank 0's worker (torch.distributed's own env://, the
/// store speaking the command's torch's protocol; the launcher holds its port) or rank 0's
/// launcher (torchrun's agent store, TORCHELASTIC_USE_AGENT_STORE: only when the launcher's
/// libtorch and the command's torch are the same version, as c10d's store protocol changes).
enum class StoreHost { kWorker, kLauncher };

/// What one worker is told (torchrun's names). `master_addr`/`master_port`: the store rank 0's
/// launcher serves.
struct WorkerContract {
  Topology topology;
  std::string master_addr;
  int master_port = 0;
  std::string run_id;
  StoreHost store = StoreHost::kWorker;
};
using EnvPairs = std::vector<std::pair<std::string, std::string>>;
/// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node), GROUP_WORLD_SIZE,
/// ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
/// TORCHELASTIC_RESTART_COUNT 0, TORCHELASTIC_MAX_RESTARTS 0, in that order, and with the
/// launcher's store TORCHELASTIC_USE_AGENT_STORE True (the workers' env:// rendezvous joins it as
/// a client).
EnvPairs torchrun_environment(const WorkerContract& c);

/// `base` ("NAME=value" entries, the launcher's own environment) with `set` replacing or adding
/// entries, and each of `defaults` added only where `base` lacks it (OMP_NUM_THREADS).
std::vector<std::string> worker_environment(const std::vector<std::string>& base, const EnvPairs& set,
                                            const EnvPairs& defaults);

}  // namespace mpiddp::app
