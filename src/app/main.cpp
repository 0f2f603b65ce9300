// mpiddp: one executable, several subcommands. MPI is initialised once here; each subcommand
// receives the Runtime and its own arguments.
#include <mpiddp/allocator.hpp>
#include <mpiddp/backends.hpp>
#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/process_group.hpp>
#include <mpiddp/runtime.hpp>

#include <algorithm>
#include <iostream>
#include <memory>
#include <thread>

#include "app/cli.hpp"

namespace {

const std::vector<mpiddp::app::Command>& commands() {
  static const std::vector<mpiddp::app::Command> list = {
      {"info", "ranks, hostnames, devices, NCCL variables, library versions and a collective sanity check",
       mpiddp::app::run_info},
      {"bench", "collective time and bandwidth per size, nccl-tests style (" + mpiddp::backend_names(", ") + ")",
       mpiddp::app::run_bench},
      {"train",
       "data-parallel training of a built-in model, a TorchScript file or a .pt2 program (HDF5 sets, token shards)",
       mpiddp::app::run_train},
      {"export", "write a snapshot's model for Python (TorchScript module, .pt2 program or state_dict)",
       mpiddp::app::run_export},
      {"generate", "continue a prompt with a built-in GPT's snapshot (nanoGPT's sampling)", mpiddp::app::run_generate},
      {"launch", "run a torchrun-style command (a Python script) on every rank, its environment from MPI",
       mpiddp::app::run_launch},
      {"data", "write datasets: mpiddp's HDF5 layout (fashion-mnist, mnist, synthetic), llm.c token shards (text)",
       mpiddp::app::run_data},
  };
  return list;
}

std::string usage() {
  std::string text =
      "usage: mpiddp <command> [options]        (under mpirun, srun or alone as one rank)\n\ncommands:\n";
  size_t width = 0;
  for (const auto& c : commands()) width = std::max(width, c.name.size());
  for (const auto& c : commands())
    text += "  " + c.name + std::string(width + 2 - c.name.size(), ' ') + c.summary + "\n";
  text += "\n`mpiddp <command> --help` lists a command's options; `mpiddp --version` prints the version.\n";
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything allocates: freed step buffers stay in the heap for the next step (see
  // allocator.hpp; MALLOC_MMAP_THRESHOLD_ and friends still win).
  mpiddp::tune_malloc_for_training();
  std::unique_ptr<mpiddp::Runtime> runtime;
  try {
    // A launcher leaves the GPU to its command (binding it would make a CUDA context there).
    mpiddp::RuntimeOptions options;
    options.bind_device = !(argc > 1 && std::string(argv[1]) == "launch");
    runtime = std::make_unique<mpiddp::Runtime>(&argc, &argv, options);
  } catch (const mpiddp::Error& e) {
    // Raised before the ranks could agree on anything: report here and end every rank.
    std::cerr << "mpiddp: error: " << e.message() << std::endl;
    int initialized = 0, size = 1;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, mpiddp::app::kExitFailure);
    if (initialized) MPI_Finalize();
    return mpiddp::app::kExitFailure;
  }

  std::vector<std::string> args(argv + 1, argv + argc);
  int code = mpiddp::app::kExitOk;
  try {
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      mpiddp::app::print_rank0(*runtime, usage());
      code = args.empty() ? mpiddp::app::kExitUsage : mpiddp::app::kExitOk;
    } else if (args[0] == "--version") {
      mpiddp::app::print_rank0(*runtime, std::string("mpiddp ") + MPIDDP_VERSION + "\n");
    } else {
      const mpiddp::app::Command* found = nullptr;
      for (const auto& c : commands()) {
        if (c.name == args[0]) found = &c;
      }
      if (!found) {
        if (runtime->rank() == 0) {
          std::cerr << "mpiddp: error: unknown command '" << args[0] << "' (try `mpiddp --help`)" << std::endl;
        }
        code = mpiddp::app::kExitUsage;
      } else {
        code = found->run(*runtime, std::vector<std::string>(args.begin() + 1, args.end()));
      }
    }
  } catch (const mpiddp::AgreedError& e) {
    // Every rank raised this one together: report once, end cleanly.
    if (runtime->rank() == 0) std::cerr << "mpiddp " << args[0] << ": error: " << e.message() << std::endl;
    code = mpiddp::app::kExitFailure;
  } catch (const mpiddp::CollectiveTimeout& e) {
    // Every waiting rank times out at about the same moment; the lowest of them reports, the
    // others give it a moment to do so before they end the job too.
    if (e.reporter()) {
      std::cerr << "mpiddp: error: " + std::string(e.what()) + "\n" << std::flush;
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    runtime->abort(mpiddp::app::kExitFailure);
  } catch (const std::exception& e) {
    // A failure inside a collective phase: the other ranks may be waiting in a collective that
    // this rank will never enter, so the whole job ends here rather than hangs.
    std::cerr << "mpiddp: error: " << e.what() << std::endl;
    runtime->abort(mpiddp::app::kExitFailure);
  }
  try {
    runtime->close();
  } catch (const std::exception& e) {
    std::cerr << "mpiddp: error: " << e.what() << std::endl;
    return mpiddp::app::kExitFailure;
  }
  return code;
}
