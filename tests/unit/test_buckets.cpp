// The bucket rule: reverse registration order, first-bucket cap, dtype boundaries, oversize params.
#include <mpiddp/ddp.hpp>

#include <gtest/gtest.h>

using mpiddp::assign_buckets;

TEST(Buckets, ReverseOrderWithFirstBucketCap) {
  // float32 params of 100, 200, 300, 400 elements (400..1600 bytes); first cap 1000 B, cap 2000 B.
  auto b = assign_buckets({100, 200, 300, 400}, std::vector<c10::ScalarType>(4, c10::kFloat), 2000, 1000);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].params, (std::vector<size_t>{3}));        // 1600 B alone: bigger than the first cap
  EXPECT_EQ(b[1].params, (std::vector<size_t>{2, 1}));     // 1200 + 800 = 2000 B
  EXPECT_EQ(b[2].params, (std::vector<size_t>{0}));
  EXPECT_EQ(b[1].offsets, (std::vector<int64_t>{0, 300}));
  EXPECT_EQ(b[1].numel, 500);
}

TEST(Buckets, FirstBucketSmall) {
  auto b = assign_buckets({10, 10, 10, 10}, std::vector<c10::ScalarType>(4, c10::kFloat), 1 << 20, 80);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].params, (std::vector<size_t>{3, 2}));  // 80 B fills the first bucket
  EXPECT_EQ(b[1].params, (std::vector<size_t>{1, 0}));
}

TEST(Buckets, OneBucketPerParamAndAllInOne) {
  std::vector<c10::ScalarType> f(5, c10::kFloat);
  EXPECT_EQ(assign_buckets({3, 1, 4, 1, 5}, f, 1, 1).size(), 5u);
  auto all = assign_buckets({3, 1, 4, 1, 5}, f, 1 << 30, 1 << 30);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].numel, 14);
  EXPECT_EQ(all[0].params, (std::vector<size_t>{4, 3, 2, 1, 0}));
}

TEST(Buckets, DtypeChangeStartsNewBucket) {
  auto b = assign_buckets({4, 4, 4}, {c10::kFloat, c10::kDouble, c10::kDouble}, 1 << 20, 1 << 20);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].dtype, c10::kDouble);
  EXPECT_EQ(b[0].params, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(b[1].dtype, c10::kFloat);
}

TEST(Buckets, BadCapsThrow) {
  EXPECT_THROW(assign_buckets({1}, {c10::kFloat}, 0, 1), mpiddp::Error);
  EXPECT_THROW(assign_buckets({1, 2}, {c10::kFloat}, 1, 1), mpiddp::Error);
}
