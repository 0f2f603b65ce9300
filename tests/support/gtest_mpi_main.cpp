// gtest main for MPI tests: every rank runs every test; only rank 0 prints. After each test the
// ranks send their failure messages to rank 0, which prints them as "[rank r] ...", and at the
// end all ranks agree on one exit code (non-zero if any rank failed anything).
#include <mpiddp/error.hpp>
#include <mpiddp/runtime.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "mpi_test.hpp"

namespace mpiddp::testing {
namespace {

std::unique_ptr<Runtime> g_runtime;
std::map<std::string, std::unique_ptr<ProcessGroup>> g_groups;

class RankReporter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::ostringstream out;
    out << (result.file_name() ? result.file_name() : "?") << ":" << result.line_number() << ": " << result.summary()
        << "\n";
    failures_ += out.str();
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const auto all = gather_strings(g_runtime->world(), failures_);
    failures_.clear();
    if (g_runtime->rank() != 0) return;
    for (size_t r = 1; r < all.size(); ++r) {  // rank 0's own failures were printed by gtest
      if (all[r].empty()) continue;
      std::cout << "[rank " << r << "] FAILED " << info.test_suite_name() << "." << info.name() << ":\n"
                << all[r] << std::flush;
    }
  }

 private:
  std::string failures_;
};

}  // namespace

Runtime& runtime() { return *g_runtime; }

ProcessGroup& checked_group(const std::string& backend) {
  auto& g = g_groups[backend];
  if (!g) {
    CommOptions o;
    o.check_collectives = true;
    o.timeout = std::chrono::seconds(120);
    const bool staged = backend == "mpi_staged";
    o.stage_through_host = staged;
    g = make_process_group(staged ? "mpi" : backend, *g_runtime, o);
  }
  return *g;
}

}  // namespace mpiddp::testing

int main(int argc, char** argv) {
  using mpiddp::testing::g_runtime;
  try {
    g_runtime = std::make_unique<mpiddp::Runtime>(&argc, &argv);
  } catch (const std::exception& e) {
    std::cerr << "cannot start MPI tests: " << e.what() << std::endl;
    return 1;
  }
  // As `mpiddp train` does: the ranks on a node share its cores. Left at libtorch's default, four
  // ranks on two cores run eight OpenMP threads that spin while they wait (ten times slower on sid).
  torch::set_num_threads(mpiddp::fair_share_of_cores(g_runtime->local_size()));
  // mpiexec hands ranks a pty, so gtest would colour logs and CTest output; --gtest_color overrides.
  ::testing::GTEST_FLAG(color) = "no";
  ::testing::InitGoogleTest(&argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (g_runtime->rank() != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new mpiddp::testing::RankReporter);  // gtest owns it from here

  int local = RUN_ALL_TESTS() == 0 ? 0 : 1;
  int any_failed = 0;
  MPI_Allreduce(&local, &any_failed, 1, MPI_INT, MPI_MAX, g_runtime->world());
  if (g_runtime->rank() == 0) {
    std::cout << (any_failed ? "FAILED" : "PASSED") << " on " << g_runtime->size() << " rank"
              << (g_runtime->size() == 1 ? "" : "s") << std::endl;
  }
  mpiddp::testing::g_groups.clear();  // before MPI is finalised
  g_runtime->close();
  g_runtime.reset();
  return any_failed;
}
