// nccl-tests' arithmetic: sizes, bus-bandwidth factors, the size sweep and percentiles.
#include <mpiddp/error.hpp>

#include <gtest/gtest.h>

#include <cmath>

#include "app/bench.hpp"

using namespace mpiddp::app::bench;
using mpiddp::Collective;
using mpiddp::traits;

TEST(BenchSize, Suffixes) {
  EXPECT_EQ(parse_size("8"), 8);
  EXPECT_EQ(parse_size("1K"), 1024);
  EXPECT_EQ(parse_size("64k"), 64 * 1024);
  EXPECT_EQ(parse_size("256M"), 256LL << 20);
  EXPECT_EQ(parse_size("2G"), 2LL << 30);
  for (const char* bad : {"", "M", "1X", "1.5M", "-4", "12MB", "99999999999999999999"}) {
    EXPECT_THROW(parse_size(bad), mpiddp::Error) << bad;
  }
}

TEST(BenchFormula, BusFactorsMatchNcclTests) {
  for (int n : {1, 2, 3, 4, 8}) {
    EXPECT_DOUBLE_EQ(traits(Collective::kAllreduce).bus_factor(n), 2.0 * (n - 1) / n);
    EXPECT_DOUBLE_EQ(traits(Collective::kAllgather).bus_factor(n), (n - 1.0) / n);
    EXPECT_DOUBLE_EQ(traits(Collective::kReduceScatter).bus_factor(n), (n - 1.0) / n);
    EXPECT_DOUBLE_EQ(traits(Collective::kAlltoall).bus_factor(n), (n - 1.0) / n);
    EXPECT_DOUBLE_EQ(traits(Collective::kBroadcast).bus_factor(n), 1.0);
  }
  // 1 GB in 0.5 s is 2 GB/s; 2 ranks' allreduce bus bandwidth equals its algorithm bandwidth.
  EXPECT_DOUBLE_EQ(algbw_gbps(1000000000, 0.5), 2.0);
  EXPECT_DOUBLE_EQ(algbw_gbps(1000000000, 0.5) * traits(Collective::kAllreduce).bus_factor(2), 2.0);
  EXPECT_DOUBLE_EQ(algbw_gbps(1 << 20, 0.0), 0.0);
}

TEST(BenchSweep, GeometricFromMinToMax) {
  auto s = sweep(Collective::kAllreduce, 8, 256LL << 20, 2, 4, 2);
  ASSERT_EQ(s.size(), 26u);  // 8 B .. 256 MiB, doubling
  EXPECT_EQ(s.front().bytes, 8);
  EXPECT_EQ(s.front().count, 2);
  EXPECT_EQ(s.back().bytes, 256LL << 20);
  for (size_t i = 1; i < s.size(); ++i) EXPECT_EQ(s[i].bytes, 2 * s[i - 1].bytes);
}

TEST(BenchSweep, SplitCollectivesRoundToWholeElementsPerRank) {
  // 3 ranks, float32: allgather's 64 B array = 16 elements -> 15 (5 per rank), reported as 60 B.
  auto s = sweep(Collective::kAllgather, 64, 64, 2, 4, 3);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].count, 15);
  EXPECT_EQ(s[0].bytes, 60);
  // Too small for one element per rank: dropped, not run with zero elements.
  EXPECT_TRUE(sweep(Collective::kReduceScatter, 8, 8, 2, 4, 4).empty());
  // Allreduce keeps single elements.
  EXPECT_EQ(sweep(Collective::kAllreduce, 4, 4, 2, 4, 4).at(0).count, 1);
}

TEST(BenchSweep, BadRangesThrow) {
  EXPECT_THROW(sweep(Collective::kAllreduce, 0, 8, 2, 4, 2), mpiddp::Error);
  EXPECT_THROW(sweep(Collective::kAllreduce, 16, 8, 2, 4, 2), mpiddp::Error);
  EXPECT_THROW(sweep(Collective::kAllreduce, 8, 16, 1.0, 4, 2), mpiddp::Error);
}

TEST(BenchStats, PercentileNearestRank) {
  EXPECT_DOUBLE_EQ(percentile({5, 1, 3, 2, 4}, 50), 3);
  EXPECT_DOUBLE_EQ(percentile({5, 1, 3, 2, 4}, 95), 5);
  EXPECT_DOUBLE_EQ(percentile({5, 1, 3, 2, 4}, 0), 1);
  EXPECT_DOUBLE_EQ(percentile({7}, 50), 7);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
}
