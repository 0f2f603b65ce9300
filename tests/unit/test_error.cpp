#include <mpiddp/diagnostics.hpp>
#include <mpiddp/error.hpp>

#include <gtest/gtest.h>
#include <hdf5.h>

#include "common/check_hdf5.hpp"

namespace {

struct RankGuard {  // restores the process-wide rank after a test sets it
  int saved = mpiddp::current_rank();
  ~RankGuard() { mpiddp::set_current_rank(saved); }
};

}  // namespace

TEST(Error, CarriesRankFileLineAndMessage) {
  RankGuard guard;
  mpiddp::set_current_rank(3);
  int line = 0;
  try {
    line = __LINE__ + 1;
    MPIDDP_THROW("boom: 42");
    FAIL() << "no throw";
  } catch (const mpiddp::Error& e) {
    EXPECT_EQ(e.rank(), 3);
    EXPECT_EQ(e.message(), "boom: 42");
    EXPECT_EQ(e.file(), "tests/unit/test_error.cpp");
    EXPECT_EQ(e.line(), line);
    EXPECT_EQ(std::string(e.what()), "[rank 3] tests/unit/test_error.cpp:" + std::to_string(e.line()) + ": boom: 42");
  }
}

TEST(Error, NoRankPrefixBeforeRuntime) {
  RankGuard guard;
  mpiddp::set_current_rank(-1);
  mpiddp::Error e("x", "/abs/path/src/runtime/runtime.cpp", 7);
  EXPECT_EQ(std::string(e.what()), "src/runtime/runtime.cpp:7: x");
}

TEST(Error, CheckThrowsOnlyOnFalse) {
  EXPECT_NO_THROW(MPIDDP_CHECK(1 + 1 == 2, "never"));
  EXPECT_THROW(MPIDDP_CHECK(1 + 1 == 3, "arithmetic"), mpiddp::Error);
}

TEST(Error, Hdf5CheckCarriesHdf5Text) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors become exceptions, not stderr noise
  try {
    MPIDDP_CHECK_HDF5(H5Fopen("/nonexistent/dir/file.h5", H5F_ACC_RDONLY, H5P_DEFAULT));
    FAIL() << "no throw";
  } catch (const mpiddp::Error& e) {
    EXPECT_NE(e.message().find("H5Fopen"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("unable to open file"), std::string::npos) << e.message();
  }
  // A successful call returns its value.
  hid_t space = MPIDDP_CHECK_HDF5(H5Screate(H5S_SCALAR));
  EXPECT_GE(space, 0);
  H5Sclose(space);
}

TEST(Diagnostics, NcclEnvironmentFilteredAndSorted) {
  std::vector<std::string> vars = {
      "PATH=/bin",          "NCCL_DEBUG=INFO", "MY_NCCL_HOME=/opt/nccl", "NCCL_IB_HCA=mlx5_0=1",
      "nccl_lower=ignored", "NOEQUALS"};
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  auto got = mpiddp::nccl_environment(envp.data());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], (std::pair<std::string, std::string>{"MY_NCCL_HOME", "/opt/nccl"}));
  EXPECT_EQ(got[1], (std::pair<std::string, std::string>{"NCCL_DEBUG", "INFO"}));
  EXPECT_EQ(got[2], (std::pair<std::string, std::string>{"NCCL_IB_HCA", "mlx5_0=1"}));  // value keeps its '='
}
