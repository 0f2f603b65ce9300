// `mpiddp info`: the SuperCloud and AWS cluster checks in one native command. Every rank
// describes itself; rank 0 prints all of it in rank order, then versions and a sanity check.
#include <mpiddp/backends.hpp>
#include <mpiddp/diagnostics.hpp>
#include <mpiddp/error.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>

#include "app/cli.hpp"
#include "app/option_table.hpp"

extern char** environ;

namespace mpiddp::app {
namespace {

using json = nlohmann::ordered_json;

json versions_json(const LibraryVersions& v, const Runtime& rt) {
  json j;
  j["mpiddp"] = v.mpiddp;
  j["mpi"] = v.mpi;
  j["mpi_standard"] = v.mpi_standard;
  j["thread_level_requested"] = thread_level_name(rt.thread_level_requested());
  j["thread_level_provided"] = thread_level_name(rt.thread_level_provided());
  j["libtorch"] = v.torch;
  j["libtorch_cuda"] = v.torch_cuda.empty() ? json(nullptr) : json(v.torch_cuda);
  j["nccl"] = v.nccl.empty() ? json(nullptr) : json(v.nccl);
  j["cuda_runtime"] = v.cuda_runtime.empty() ? json(nullptr) : json(v.cuda_runtime);
  j["cuda_driver"] = v.cuda_driver.empty() ? json(nullptr) : json(v.cuda_driver);
  j["hdf5"] = v.hdf5;
  j["hdf5_parallel"] = v.hdf5_parallel;
  j["backends"] = available_backends();
  j["mpi_cuda_aware"] = v.mpi_cuda_aware;
  return j;
}

// What one rank knows about itself, named as torchrun names it.
json describe_rank(const Runtime& rt) {
  const Topology& t = rt.topology();
  json j;
  j["hostname"] = rt.hostname();
  j["RANK"] = t.rank;
  j["WORLD_SIZE"] = t.size;
  j["LOCAL_RANK"] = t.local_rank;
  j["LOCAL_WORLD_SIZE"] = t.local_size;
  j["GROUP_RANK"] = t.node_rank;
  j["NODE_COUNT"] = t.node_count;
  j["device"] = rt.device().str();
  j["visible_gpus"] = rt.visible_gpus();
  if (auto g = describe_gpu(rt.device())) {
    j["gpu"] = {{"name", g->name},
                {"uuid", g->uuid},
                {"pci_bus_id", g->pci_bus_id},
                {"memory_gib", g->memory_gib},
                {"compute_capability", g->compute_capability}};
  } else {
    j["gpu"] = nullptr;
  }
  json nccl = json::object();
  for (const auto& [k, v] : nccl_environment(environ)) nccl[k] = v;
  j["nccl_env"] = nccl;
  j["versions"] = versions_json(library_versions(), rt);
  return j;
}

std::string format_text(const json& ranks, const json& checks, bool ok) {
  std::ostringstream out;
  const json& first = ranks.at(0);
  out << "mpiddp " << first["versions"]["mpiddp"].get<std::string>() << " info: " << ranks.size() << " rank"
      << (ranks.size() == 1 ? "" : "s") << " on " << first["NODE_COUNT"].get<int>() << " node"
      << (first["NODE_COUNT"].get<int>() == 1 ? "" : "s") << "\n";
  for (const auto& r : ranks) {
    const std::string host = r["hostname"];
    out << host << ": " << r["RANK"].get<int>() << " of " << r["WORLD_SIZE"].get<int>() << "\n";
    for (const char* key : {"LOCAL_RANK", "RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"}) {
      out << host << " " << key << " : " << r[key].get<int>() << "\n";
    }
    out << host << " DEVICE : " << r["device"].get<std::string>() << "\n";
    const json& g = r["gpu"];
    out << host << " GPU : ";
    if (g.is_null()) {
      out << "none\n";
    } else {
      char mem[32];
      std::snprintf(mem, sizeof mem, "%.1f GiB", g["memory_gib"].get<double>());
      const int cc = g["compute_capability"].get<int>();
      out << g["name"].get<std::string>() << " (" << mem << ", compute " << cc / 10 << "." << cc % 10 << ", PCI "
          << g["pci_bus_id"].get<std::string>() << ", " << g["uuid"].get<std::string>() << ")\n";
    }
    for (const auto& [k, v] : r["nccl_env"].items()) out << host << " " << k << " : " << v.get<std::string>() << "\n";
  }
  const json& v = first["versions"];
  auto or_none = [](const json& x) { return x.is_null() ? std::string("not built") : x.get<std::string>(); };
  out << "versions (rank 0)\n"
      << "  mpiddp    : " << v["mpiddp"].get<std::string>() << "\n"
      << "  MPI       : " << v["mpi"].get<std::string>() << " (MPI " << v["mpi_standard"].get<std::string>() << ")\n"
      << "  threads   : " << v["thread_level_provided"].get<std::string>() << " (requested "
      << v["thread_level_requested"].get<std::string>() << ")\n"
      << "  libtorch  : " << v["libtorch"].get<std::string>()
      << (v["libtorch_cuda"].is_null() ? std::string(", CPU only") : ", CUDA " + v["libtorch_cuda"].get<std::string>())
      << "\n"
      << "  NCCL      : " << or_none(v["nccl"]) << "\n"
      << "  CUDA      : "
      << (v["cuda_runtime"].is_null()
              ? std::string("not built")
              : "runtime " + v["cuda_runtime"].get<std::string>() + ", driver " + v["cuda_driver"].get<std::string>())
      << ", " << first["visible_gpus"].get<int>() << " GPU(s) visible to rank 0\n"
      << "  CUDA-aware MPI: " << v["mpi_cuda_aware"].get<std::string>() << "\n"
      << "  HDF5      : " << v["hdf5"].get<std::string>()
      << (v["hdf5_parallel"].get<bool>() ? " (parallel)" : " (serial)") << "\n"
      << "  backends  : ";
  for (size_t i = 0; i < v["backends"].size(); ++i) out << (i ? ", " : "") << v["backends"][i].get<std::string>();
  out << "\n";
  for (const auto& r : ranks) {
    if (r["versions"] != v) {
      out << "WARNING: rank " << r["RANK"].get<int>() << " on " << r["hostname"].get<std::string>()
          << " runs other library versions than rank 0: " << r["versions"].dump() << "\n";
    }
  }
  out << "sanity check (" << ranks.size() << " rank" << (ranks.size() == 1 ? "" : "s") << ")\n";
  for (const auto& c : checks) {
    out << "  " << c["name"].get<std::string>() << " : ";
    if (c["ok"].get<bool>()) {
      out << "ok\n";
    } else {
      out << "WRONG on rank(s)";
      for (const auto& r : c["failed_ranks"]) out << " " << r.get<int>();
      out << "\n";
    }
  }
  out << (ok ? "OK" : "FAILED") << "\n";
  return out.str();
}

// What the command line says; its initial values are the options' defaults.
struct InfoConfig {
  bool as_json = false;
  int inject_fault = -1;
};

// Every `mpiddp info` option, once.
const std::vector<OptionRow<InfoConfig>>& info_options() {
  using C = InfoConfig;
  static const std::vector<OptionRow<C>> rows = {
      flag_switch<C>(
          "json", [](C & c) -> auto& { return c.as_json; }, "print one JSON document instead of text"),
      option<C>(
          "inject-fault", [](C & c) -> auto& { return c.inject_fault; },
          "make RANK contribute wrong values to the sanity check (to test the FAILED path)")
          .value_name("RANK"),
  };
  return rows;
}

}  // namespace

int run_info(Runtime& runtime, const std::vector<std::string>& args) {
  InfoConfig c;
  const auto options = describe("mpiddp info options", info_options(), c);
  po::variables_map vm;
  if (auto code = agree_on_local_phase(runtime, "info", [&] { vm = parse_options(options, args); })) return *code;
  if (vm.count("help")) {
    print_help(runtime,
               "usage: mpirun -np N mpiddp info [options]\n\n"
               "Prints every rank's hostname, rank, local rank, node index, device, GPU and NCCL_* variables in\n"
               "rank order, the library versions (CUDA-aware MPI or not), and checks allreduce, broadcast and\n"
               "allgather on all ranks.\n"
               "Exit status 0 when the sanity check passes on every rank, 1 otherwise.\n\n",
               options);
    return kExitOk;
  }

  const std::string mine = describe_rank(runtime).dump();
  const auto all = gather_strings(runtime.world(), mine);
  const auto results = run_sanity_checks(runtime, c.inject_fault);
  bool ok = true;
  json checks = json::array();
  for (const auto& r : results) {
    ok = ok && r.ok;
    checks.push_back({{"name", r.name}, {"ok", r.ok}, {"ranks_ok", r.ranks_ok}, {"failed_ranks", r.failed_ranks}});
  }
  if (runtime.rank() == 0) {
    json ranks = json::array();
    for (const auto& s : all) ranks.push_back(json::parse(s));
    if (c.as_json) {
      json doc = {{"world_size", runtime.size()},
                  {"node_count", runtime.node_count()},
                  {"ranks", ranks},
                  {"sanity_check", {{"ok", ok}, {"checks", checks}}},
                  {"result", ok ? "OK" : "FAILED"}};
      std::cout << doc.dump(2) << std::endl;
    } else {
      std::cout << format_text(ranks, checks, ok) << std::flush;
    }
  }
  return ok ? kExitOk : kExitFailure;
}

}  // namespace mpiddp::app
