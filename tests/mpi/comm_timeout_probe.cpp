// Probe for the timeout path (driven by tests/system/comm_timeout.sh): the ranks listed in
// --late never enter the collective; the others must time out, name the late ranks, and end the
// job. The collective is a process group's allreduce, or with --in step the Runtime's agreement
// helper (all_ok, a CollectiveStep on its world; its timeout and warnings come from the
// environment, MPIDDP_COMM_TIMEOUT and MPIDDP_STALL_WARNING), or with --in hdf5 a blocking call
// inside HDF5 (the collective MPI-IO open of a dataset file written to --dir; its way out is
// BlockingCall's watchdog, MPIDDP_COMM_TIMEOUT; prints "no parallel HDF5" and exits 0 without one).
// usage: comm_timeout_probe --backend B --late 0,2 --timeout-ms 1000 --check 0|1 [--in allreduce|step|hdf5 --dir D]
#include <mpiddp/config.hpp>
#include <mpiddp/data.hpp>
#include <mpiddp/process_group.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

int main(int argc, char** argv) {
  mpiddp::Runtime rt(&argc, &argv);
  std::string backend = "mpi";
  std::string in = "allreduce";
  std::string dir = ".";
  std::set<int> late;
  mpiddp::CommOptions opts;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i], value = argv[i + 1];
    if (key == "--backend") backend = value;
    if (key == "--timeout-ms") opts.timeout = std::chrono::milliseconds(std::stol(value));
    if (key == "--check") opts.check_collectives = value == "1";
    if (key == "--in") in = value;
    if (key == "--dir") dir = value;
    if (key == "--late") {
      std::stringstream ss(value);
      for (std::string r; std::getline(ss, r, ',');) late.insert(std::stoi(r));
    }
  }
  if (in == "hdf5" && !MPIDDP_HDF5_PARALLEL) {
    if (rt.rank() == 0) std::cout << "no parallel HDF5" << std::endl;
    return 0;
  }
  const std::string data = dir + "/probe.h5";
  if (in == "hdf5" && rt.rank() == 0)
    mpiddp::write_dataset(data, torch::zeros({4, 2}), torch::zeros({4}, torch::kLong), 1.0, 2);
  auto pg = mpiddp::make_process_group(backend, rt, opts);
  auto t = torch::ones({8}, torch::kFloat);
  pg->allreduce(t);  // #1: everyone, so the group is known to work
  if (late.count(rt.rank())) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // "stuck in compute"; ended by the abort
    return 0;
  }
  try {
    if (in == "step") {
      mpiddp::all_ok(rt.world(), true);  // the late ranks never come
    } else if (in == "hdf5") {
      mpiddp::H5Dataset dataset(data);
      dataset.open_parallel(rt.world());  // blocks in HDF5's MPI-IO open: the late ranks never come
    } else {
      pg->allreduce(t);  // #2: the late ranks never come
    }
  } catch (const mpiddp::CollectiveTimeout& e) {
    // As `mpiddp` does: the reporting rank writes the error, the others give it time to.
    if (e.reporter()) {
      std::cerr << "mpiddp: error: " << e.what() << std::endl;
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    rt.abort(3);
  }
  std::cerr << "rank " << rt.rank() << ": the " << in << " completed although ranks were late" << std::endl;
  return 1;
}
