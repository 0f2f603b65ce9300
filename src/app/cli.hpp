// Shared plumbing for mpiddp's subcommands: option parsing and cross-rank error agreement.
// src/app/ is the only place that includes Boost.Program_options.
#pragma once

#include <mpiddp/runtime.hpp>

#include <boost/program_options.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mpiddp::app {

namespace po = boost::program_options;

/// Exit codes shared by every subcommand.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;      ///< the command ran and found a failure (e.g. sanity check FAILED)
constexpr int kExitUsage = 2;        ///< bad input: unknown option, bad value, missing file
constexpr int kExitCannotRun = 127;  ///< launch: the command cannot be started (as a shell says)

/// Parses `args` against `options`: command line first, then the file named by --config (when
/// `options` has it), then MPIDDP_<OPTION_NAME> environment variables (e.g. MPIDDP_BATCH_SIZE
/// for --batch-size). The first source that sets a value wins. Throws po::error on bad input.
po::variables_map parse_options(const po::options_description& options, const std::vector<std::string>& args,
                                const po::positional_options_description* positional = nullptr);

/// "MPIDDP_BATCH_SIZE" for "batch-size".
std::string env_name_for(const std::string& option);

/// Runs `body` on every rank, then makes every rank agree on whether it threw: on any failure,
/// rank 0 prints each distinct error once (with the ranks that raised it when not all did) as
/// "mpiddp <command>: error: <message>" and every rank gets `failure_code`. Returns std::nullopt
/// when every rank succeeded. `body` must not call collectives (a rank that threw early would
/// leave the others waiting in them); it is the local phase of a command.
std::optional<int> agree_on_local_phase(const Runtime& runtime, const std::string& command,
                                        const std::function<void()>& body, int failure_code = kExitUsage);

/// Prints `usage` then the option table on rank 0 (a command's --help).
void print_help(const Runtime& runtime, const std::string& usage, const po::options_description& options);

/// Prints `text` on rank 0 only.
void print_rank0(const Runtime& runtime, const std::string& text);

/// A command whose work is rank 0's alone (data, export, generate): its options are parsed and
/// checked on every rank (agreed), --help prints `usage` and the table, `work` runs on rank 0 (the
/// other ranks wait for its verdict) and what it returns is printed there as it is.
struct Rank0Command {
  std::string name;  ///< "export": the "mpiddp export: error: ..." lines
  std::string usage;
  const po::options_description& options;
  const po::positional_options_description* positional = nullptr;
  std::function<void(const po::variables_map&)> check;  ///< after parsing (not with --help); throws on bad input
  std::function<std::string()> work;
};
int run_rank0_command(Runtime& runtime, const std::vector<std::string>& args, const Rank0Command& command);

/// A subcommand: name, one-line summary, and its entry point (args exclude the command name).
struct Command {
  std::string name;
  std::string summary;
  std::function<int(Runtime&, const std::vector<std::string>&)> run;
};

int run_info(Runtime& runtime, const std::vector<std::string>& args);
int run_bench(Runtime& runtime, const std::vector<std::string>& args);
int run_data(Runtime& runtime, const std::vector<std::string>& args);
int run_train(Runtime& runtime, const std::vector<std::string>& args);
int run_export(Runtime& runtime, const std::vector<std::string>& args);
int run_generate(Runtime& runtime, const std::vector<std::string>& args);
int run_launch(Runtime& runtime, const std::vector<std::string>& args);

}  // namespace mpiddp::app
