// Built against the installed package: bootstraps with Runtime, runs the sanity check and an
// MPI allreduce of (rank + 1), and prints one line per rank from rank 0.
#include <mpiddp/diagnostics.hpp>
#include <mpiddp/runtime.hpp>

#include <iostream>

int main(int argc, char** argv) {
  mpiddp::Runtime rt(&argc, &argv);
  bool ok = true;
  for (const auto& r : mpiddp::run_sanity_checks(rt)) ok = ok && r.ok;
  int sum = rt.rank() + 1;
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_INT, MPI_SUM, rt.world());
  std::string line = "consumer: rank " + std::to_string(rt.rank()) + " of " + std::to_string(rt.size()) +
                     (ok ? ", sanity ok" : ", sanity FAILED") + ", sum " + std::to_string(sum) + "\n";
  for (const auto& l : mpiddp::gather_strings(rt.world(), line)) std::cout << l;
  rt.close();
  return ok ? 0 : 1;
}
