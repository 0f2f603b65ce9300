// CommOptions from the environment, and names the CLI accepts.
#include <mpiddp/comm_options.hpp>
#include <mpiddp/process_group.hpp>
#include <mpiddp/reduction.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include "error_of.hpp"
#include "scoped.hpp"

namespace {
using mpiddp::testing::EnvGuard;
}  // namespace

TEST(CommOptions, DefaultsWithoutEnvironment) {
  auto o = mpiddp::CommOptions::from_environment();
  EXPECT_EQ(o.timeout, std::chrono::minutes(5));
  EXPECT_FALSE(o.check_collectives);
}

TEST(CommOptions, EnvironmentOverrides) {
  EnvGuard t("MPIDDP_COMM_TIMEOUT", "2.5");
  EnvGuard c("MPIDDP_CHECK_COLLECTIVES", "1");
  auto o = mpiddp::CommOptions::from_environment();
  EXPECT_EQ(o.timeout, std::chrono::milliseconds(2500));
  EXPECT_TRUE(o.check_collectives);
}

TEST(CommOptions, BadValuesAreErrors) {
  {
    EnvGuard t("MPIDDP_COMM_TIMEOUT", "soon");
    EXPECT_THROW(mpiddp::CommOptions::from_environment(), mpiddp::Error);
  }
  {
    EnvGuard t("MPIDDP_COMM_TIMEOUT", "-1");
    EXPECT_THROW(mpiddp::CommOptions::from_environment(), mpiddp::Error);
  }
  EnvGuard c("MPIDDP_CHECK_COLLECTIVES", "yes");
  EXPECT_THROW(mpiddp::CommOptions::from_environment(), mpiddp::Error);
}

TEST(CommNames, ParseAndPrint) {
  EXPECT_EQ(mpiddp::parse_collective("reduce_scatter"), mpiddp::Collective::kReduceScatter);
  EXPECT_EQ(mpiddp::to_string(mpiddp::Collective::kAlltoall), "alltoall");
  EXPECT_EQ(mpiddp::dtype_name(c10::kBFloat16), "bfloat16");
  EXPECT_TRUE(mpiddp::is_supported_dtype(c10::kHalf));
  EXPECT_FALSE(mpiddp::is_supported_dtype(c10::kComplexFloat));
  try {
    mpiddp::parse_collective("gossip");
    FAIL();
  } catch (const mpiddp::Error& e) {
    EXPECT_NE(e.message().find("allreduce|broadcast|allgather|reduce_scatter|alltoall|barrier"), std::string::npos)
        << e.message();
  }
}

TEST(CommNames, CompressionIsTheWireDtypes) {
  // `mpiddp train --compression` takes the library's names, and check_wire_dtype's rule is theirs.
  EXPECT_EQ(mpiddp::compression_names(), (std::vector<std::string>{"none", "bf16", "fp16"}));
  EXPECT_FALSE(mpiddp::parse_compression("none").has_value());
  EXPECT_EQ(mpiddp::parse_compression("bf16"), c10::kBFloat16);
  EXPECT_EQ(mpiddp::parse_compression("fp16"), c10::kHalf);
  EXPECT_EQ(mpiddp::testing::error_of([] { mpiddp::parse_compression("fp8", "--compression"); }),
            "unknown --compression 'fp8' (none, bf16, fp16)");
  EXPECT_EQ(mpiddp::testing::error_of([] { mpiddp::check_wire_dtype(c10::kHalf); }), "");
  EXPECT_EQ(mpiddp::testing::error_of([] { mpiddp::check_wire_dtype(c10::kFloat); }),
            "gradient compression takes bfloat16 or float16, not float32");
}
