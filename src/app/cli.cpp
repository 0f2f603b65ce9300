#include "app/cli.hpp"

#include <mpiddp/error.hpp>
#include <mpiddp/process_group.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "runtime/agreement.hpp"

namespace mpiddp::app {

std::string env_name_for(const std::string& option) {
  std::string name = "MPIDDP_";
  for (char c : option) name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

po::variables_map parse_options(const po::options_description& options, const std::vector<std::string>& args,
                                const po::positional_options_description* positional) {
  po::variables_map vm;
  po::command_line_parser parser(args);
  parser.options(options);
  if (positional) parser.positional(*positional);
  po::store(parser.run(), vm);

  if (options.find_nothrow("config", false) && vm.count("config")) {
    const auto path = vm["config"].as<std::string>();
    std::ifstream in(path);
    if (!in) throw po::error("cannot open config file '" + path + "'");
    po::store(po::parse_config_file(in, options), vm);
  }

  // Only names of this command's options map; other MPIDDP_* variables (MPIDDP_ROOT from the
  // modulefile, say) are ignored.
  std::map<std::string, std::string> env_to_option;
  for (const auto& opt : options.options()) {
    if (opt->semantic()->max_tokens() > 0) env_to_option[env_name_for(opt->long_name())] = opt->long_name();
  }
  env_to_option.erase(env_name_for("help"));
  env_to_option.erase(env_name_for("config"));
  po::store(po::parse_environment(options,
                                  [&](const std::string& var) {
                                    auto it = env_to_option.find(var);
                                    return it == env_to_option.end() ? std::string() : it->second;
                                  }),
            vm);
  po::notify(vm);
  return vm;
}

std::optional<int> agree_on_local_phase(const Runtime& runtime, const std::string& command,
                                        const std::function<void()>& body, int failure_code) {
  // A CollectiveTimeout goes on (not this rank's own failure: agreeing on it would wait a second
  // timeout); a foreign error is kept whole (Boost.PO's is one line).
  detail::LocalFailure failure;
  failure.run(body, [](const std::exception& e) -> std::string {
    const auto* ours = dynamic_cast<const mpiddp::Error*>(&e);
    return ours ? ours->message() : e.what();
  });
  if (!detail::any_rank_failed(runtime.world(), failure)) return std::nullopt;

  auto errors = gather_strings(runtime.world(), failure.reason());
  if (runtime.rank() == 0) {
    std::map<std::string, std::vector<int>> ranks_by_error;  // ordered: deterministic output
    for (int r = 0; r < static_cast<int>(errors.size()); ++r) {
      if (!errors[static_cast<size_t>(r)].empty()) ranks_by_error[errors[static_cast<size_t>(r)]].push_back(r);
    }
    for (const auto& [message, ranks] : ranks_by_error) {
      std::string who;
      if (static_cast<int>(ranks.size()) != runtime.size()) {
        who = " [rank";
        who += ranks.size() > 1 ? "s" : "";
        for (size_t i = 0; i < ranks.size(); ++i) who += (i ? "," : " ") + std::to_string(ranks[i]);
        who += "]";
      }
      std::cerr << "mpiddp " << command << ": error: " << message << who << std::endl;
    }
  }
  return failure_code;
}

int run_rank0_command(Runtime& runtime, const std::vector<std::string>& args, const Rank0Command& c) {
  po::variables_map vm;
  auto parse = [&] {
    vm = parse_options(c.options, args, c.positional);
    if (!vm.count("help") && c.check) c.check(vm);
  };
  if (auto code = agree_on_local_phase(runtime, c.name, parse)) return *code;
  if (vm.count("help")) {
    print_help(runtime, c.usage, c.options);
    return kExitOk;
  }
  std::string report;
  auto work = [&] {
    if (runtime.rank() == 0) report = c.work();
  };
  if (auto code = agree_on_local_phase(runtime, c.name, work, kExitFailure)) return *code;
  print_rank0(runtime, report);
  return kExitOk;
}

void print_help(const Runtime& runtime, const std::string& usage, const po::options_description& options) {
  std::ostringstream help;
  help << usage << "\n" << options;
  print_rank0(runtime, help.str());
}

void print_rank0(const Runtime& runtime, const std::string& text) {
  if (runtime.rank() == 0) std::cout << text << std::flush;
}

}  // namespace mpiddp::app
