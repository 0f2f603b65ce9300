// BlockingCall's watchdog: a call past its timeout ends the process with one error line naming
// it; calls that end in time, or are nested, leave it alone. (Without MPI: the exit is the
// process's own, as where MPI forbids a second thread to call it.)
#include <mpiddp/runtime.hpp>

#include <gtest/gtest.h>

#include <thread>

using namespace std::chrono_literals;

namespace {

class BlockingCallDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }  // the watchdog is a thread
};

TEST_F(BlockingCallDeathTest, ACallPastItsTimeoutEndsTheProcessNamingIt) {
  EXPECT_EXIT(
      {
        mpiddp::BlockingCall call("collective open of 'x.h5' (HDF5 MPI-IO)", 200ms);
        std::this_thread::sleep_for(10s);  // "blocked in HDF5"
      },
      ::testing::ExitedWithCode(1),
      "^mpiddp: error: collective open of 'x.h5' \\(HDF5 MPI-IO\\) did not complete within 0.2 s "
      "\\(MPIDDP_COMM_TIMEOUT\\): a rank has stopped, hung or died");
}

TEST_F(BlockingCallDeathTest, TheEarliestDeadlineFiresWhateverTheOrderOfTheCalls) {
  EXPECT_EXIT(
      {
        mpiddp::BlockingCall outer("the outer call", 60s);
        mpiddp::BlockingCall inner("the inner call", 300ms);
        std::this_thread::sleep_for(10s);
      },
      ::testing::ExitedWithCode(1), "the inner call did not complete within 0.3 s");
}

TEST_F(BlockingCallDeathTest, CallsThatEndInTimeAreForgotten) {
  EXPECT_EXIT(
      {
        for (int i = 0; i < 3; ++i) {
          mpiddp::BlockingCall call("a quick call", 400ms);
          std::this_thread::sleep_for(20ms);
        }
        { mpiddp::BlockingCall longer("a call that still ends in time", 5s); }
        std::this_thread::sleep_for(1s);  // past every quick call's deadline
        std::exit(7);
      },
      ::testing::ExitedWithCode(7), "^$");
}

}  // namespace
