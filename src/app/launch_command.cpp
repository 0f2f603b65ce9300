// `mpiddp launch [OPTIONS] [--] COMMAND ARGS...`: under mpirun, srun or LLsub, each rank runs
// COMMAND (a torchrun-style Python script) as its child with torchrun's environment derived from
// MPI alone. The rendezvous store's port is one the kernel picked for rank 0's launcher (sent by
// MPI_Bcast, held until the store takes it: no port race); rank 0's worker serves the store, or
// with --store launcher rank 0's launcher does, as torchrun's agent does. A child that fails ends
// the whole job with its status; the signals a launcher receives reach its child.
#include <mpiddp/error.hpp>

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "app/cli.hpp"
#include "app/launch.hpp"
#include "app/option_table.hpp"
#include "comm/served_store.hpp"
#include "common/check.hpp"
#include "runtime/child_process.hpp"

extern char** environ;

namespace mpiddp::app {
namespace {

constexpr auto kStoreTimeout = std::chrono::minutes(30);

const char* const kUsage =
    "usage: mpirun -np N mpiddp launch [options] [--] COMMAND [ARGS...]\n\n"
    "Runs COMMAND on every rank with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR,\n"
    "MASTER_PORT, TORCHELASTIC_*) derived from MPI: a script that calls\n"
    "torch.distributed.init_process_group() with env:// runs unchanged, on a port rank 0's launcher\n"
    "picked and holds for its store. OMP_NUM_THREADS, when unset, is this node's cores shared among\n"
    "its ranks; USE_LIBUV, when unset, 0 (the store every torch build has); on several nodes\n"
    "GLOO_SOCKET_IFNAME, when unset, is the interface that reaches rank 0.\n"
    "A command that fails on one rank ends the job with its exit status; SIGTERM, SIGINT, SIGHUP,\n"
    "SIGUSR1, SIGUSR2 and SIGCONT are passed on to the command.\n\n";

std::string command_text(const std::vector<std::string>& command) {
  std::string text;
  for (const auto& w : command) text += (text.empty() ? "" : " ") + w;
  return text.size() > 200 ? text.substr(0, 197) + "..." : text;
}

// Rank 0's interfaces (with their names), on every rank. Collective.
std::vector<Ipv4Interface> rank0_interfaces(const Runtime& rt) {
  std::ostringstream text;
  if (rt.rank() == 0) {
    for (const auto& f : ipv4_interfaces()) text << f.name << ' ' << f.address << ' ' << f.netmask << '\n';
  }
  std::string listed = text.str();
  broadcast_string(rt.world(), listed);
  std::istringstream in(listed);
  std::vector<Ipv4Interface> out;
  Ipv4Interface f;
  while (in >> f.name >> f.address >> f.netmask) out.push_back(f);
  return out;
}

// Where this node's workers dial rank 0's store, and the interface Gloo should use to reach the
// others ("": let Gloo decide). One node: the loopback. Several: the first of rank 0's interfaces
// that every node reaches (launch.hpp: no name resolution, so names that resolve to 127.0.1.1 or not
// at all do not matter); --master-addr overrides its address; without one, rank 0's hostname.
// Collective.
std::pair<std::string, std::string> master_address(const Runtime& rt, const std::string& given) {
  if (rt.node_count() == 1) return {given.empty() ? "127.0.0.1" : given, ""};
  const auto rank0 = rank0_interfaces(rt);
  const auto mine = ipv4_interfaces();
  uint64_t reachable = reachable_rank0_interfaces(rank0, mine, rt.node_rank() == 0);
  {
    CollectiveStep step(rt.world(), "agreement on rank 0's reachable interfaces");
    MPI_Request rq;
    MPIDDP_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, &reachable, 1, MPI_UINT64_T, MPI_BAND, rt.world(), &rq));
    step.wait(rq);
  }
  const auto common = first_interface(reachable);
  const std::string gloo_interface = common ? interface_towards(rank0[*common], mine) : "";
  if (!given.empty()) return {given, gloo_interface};
  if (common) return {ipv4_text(rank0[*common].address), gloo_interface};
  return {rt.hostnames()[0], ""};
}

// SLURM_JOB_ID when Slurm runs the job, else one made up on rank 0. Collective.
std::string run_id(const Runtime& rt) {
  std::string id;
  if (rt.rank() == 0) {
    const char* job = std::getenv("SLURM_JOB_ID");
    id = job && *job ? job : "mpiddp-" + rt.hostname() + "-" + std::to_string(::getpid());
  }
  broadcast_string(rt.world(), id);
  return id;
}

// Returns once every rank's command has ended well. Polls every 100 ms instead of spinning in
// MPI_Barrier: the node's cores belong to the commands still running. A rank whose command fails
// aborts the job, which ends this wait too.
void wait_for_every_command(const Runtime& rt) {
  MPI_Request all_ended;
  MPIDDP_CHECK_MPI(MPI_Ibarrier(rt.world(), &all_ended));
  for (int done = 0;;) {
    MPIDDP_CHECK_MPI(MPI_Test(&all_ended, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::vector<std::string> own_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) out.emplace_back(*e);
  return out;
}

// "rank R (host): NAME=value ..." of the variables launch set, rank 0 printing every rank's in order.
void print_contracts(const Runtime& rt, const std::vector<std::string>& env, const EnvPairs& names) {
  std::ostringstream line;
  line << "rank " << rt.rank() << " (" << rt.hostname() << "):";
  for (const auto& [name, value] : names) {
    for (const auto& entry : env) {
      if (entry.compare(0, name.size() + 1, name + "=") == 0) line << " " << entry;
    }
  }
  const auto lines = gather_strings(rt.world(), line.str());
  if (rt.rank() == 0) {
    for (const auto& l : lines) std::cout << l << "\n";
    std::cout << std::flush;
  }
}

// What the command line says before COMMAND; its initial values are the options' defaults.
struct LaunchConfig {
  std::string master_addr, store_host = "worker";
  bool print_env = false;
};

// Every `mpiddp launch` option, once.
const std::vector<OptionRow<LaunchConfig>>& launch_options() {
  using C = LaunchConfig;
  static const std::vector<OptionRow<C>> rows = {
      option<C>(
          "master-addr", [](C & c) -> auto& { return c.master_addr; },
          "the address the workers dial for rank 0's store (default: 127.0.0.1 on one node, else the first of "
          "rank 0's interfaces every node reaches on a subnet of its own, else rank 0's hostname)",
          kNoDefault),
      option<C>(
          "store", [](C & c) -> auto& { return c.store_host; },
          "who serves the workers' rendezvous store: worker (rank 0's command, on a port its launcher "
          "holds for it; any torch) | launcher (rank 0's launcher, torchrun's agent store; the command's "
          "torch must be the version mpiddp was built with)"),
      flag_switch<C>(
          "print-env", [](C & c) -> auto& { return c.print_env; },
          "print what each rank's command gets (rank 0, in rank order)"),
  };
  return rows;
}

}  // namespace

int run_launch(Runtime& runtime, const std::vector<std::string>& args) {
  LaunchConfig c;
  const auto options = describe("launch options", launch_options(), c);
  std::set<std::string> taking_values;
  for (const auto& o : options.options()) {
    if (o->semantic()->max_tokens() > 0) taking_values.insert("--" + o->long_name());
  }
  const LaunchArgs split = split_launch_args(args, taking_values);
  po::variables_map vm;
  auto parse = [&] {
    vm = parse_options(options, split.options);
    MPIDDP_CHECK(c.store_host == "worker" || c.store_host == "launcher",
                 "unknown --store '" + c.store_host + "' (worker, launcher)");
    MPIDDP_CHECK(vm.count("help") || !split.command.empty(),
                 "no command to run (usage: mpirun -np N mpiddp launch [options] -- COMMAND [ARGS...])");
  };
  if (auto code = agree_on_local_phase(runtime, "launch", parse)) return *code;
  if (vm.count("help")) {
    print_help(runtime, kUsage, options);
    return kExitOk;
  }

  // Collective set-up: the store's port, the address the workers dial, the run's name.
  const StoreHost host = c.store_host == "launcher" ? StoreHost::kLauncher : StoreHost::kWorker;
  detail::ServedStore store;
  std::unique_ptr<ReservedPort> reserved;
  if (host == StoreHost::kLauncher) {
    // serve_store throws on every rank alike after its broadcast: no rank is left in a collective.
    if (auto code = agree_on_local_phase(
            runtime, "launch",
            [&] { store = detail::serve_store(runtime, "127.0.0.1", runtime.size(), kStoreTimeout, "mpiddp launch"); },
            kExitFailure)) {
      return *code;
    }
  } else {
    if (auto code = agree_on_local_phase(
            runtime, "launch",
            [&] {
              if (runtime.rank() == 0) reserved = std::make_unique<ReservedPort>();
            },
            kExitFailure)) {
      return *code;
    }
    store.port = reserved ? reserved->port() : 0;
    store.port = static_cast<int>(broadcast_int64(runtime.world(), store.port));
  }
  const auto [master_addr, gloo_interface] = master_address(runtime, c.master_addr);
  const WorkerContract contract{runtime.topology(), master_addr, store.port, run_id(runtime), host};
  const EnvPairs set = torchrun_environment(contract);
  // USE_LIBUV=0: torch 2.x's env:// store asks for its libuv backend unless told otherwise, and fails
  // where torch was built without it (Debian's python3-torch 2.x); the classic one is in every build.
  EnvPairs defaults = {{"OMP_NUM_THREADS", std::to_string(fair_share_of_cores(runtime.local_size()))},
                       {"USE_LIBUV", "0"}};
  if (!gloo_interface.empty()) defaults.emplace_back("GLOO_SOCKET_IFNAME", gloo_interface);
  const auto env = worker_environment(own_environment(), set, defaults);
  if (c.print_env) {
    EnvPairs shown = set;
    shown.insert(shown.end(), defaults.begin(), defaults.end());
    print_contracts(runtime, env, shown);
  }

  std::unique_ptr<detail::ChildProcess> child;
  auto start = [&] {
    child = std::make_unique<detail::ChildProcess>(split.command, env);
    child->forward_signals();
  };
  if (auto code = agree_on_local_phase(runtime, "launch", start, kExitCannotRun))
    return *code;  // ~child ends any started

  const detail::ChildExit end = child->wait();
  if (end.ok()) {
    wait_for_every_command(runtime);  // the store stays until then: other ranks' torch may use it
    return kExitOk;
  }
  // Ended from outside (scancel, mpirun ending the job): no report, no MPI_Abort of our own; the
  // other ranks are being ended too, so MPI_Finalize could wait for ranks that are gone.
  if (detail::ChildProcess::ending_signal_passed_on()) std::_Exit(end.shell_status());
  std::cerr << "mpiddp launch: error: rank " << runtime.rank() << " (" << runtime.hostname() << "): '"
            << command_text(split.command) << "' " << end.text() << std::endl;
  runtime.abort(end.shell_status());
}

}  // namespace mpiddp::app
