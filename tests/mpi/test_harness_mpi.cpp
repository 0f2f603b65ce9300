// The MPI gtest main itself: verdict agreement, and (run by tests/system/harness_reports.sh with
// --gtest_also_run_disabled_tests) that failures on other ranks reach rank 0 and the exit code.
#include "mpi_test.hpp"

using mpiddp::testing::on_all_ranks;
using mpiddp::testing::runtime;

TEST(Harness, AgreementIsUnanimous) {
  EXPECT_TRUE(on_all_ranks(true));
  EXPECT_EQ(on_all_ranks(runtime().rank() == 0), runtime().size() == 1);
}

// Deliberately fails on every rank but 0: rank 0's gtest output alone would call it passed.
TEST(HarnessSelfTest, DISABLED_FailsOnNonZeroRanks) {
  EXPECT_EQ(runtime().rank(), 0) << "deliberate failure on rank " << runtime().rank();
}
