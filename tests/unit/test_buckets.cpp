// The bucket rule: reverse registration order, first-bucket cap, dtype boundaries, oversize params.
#include <mpiddp/ddp.hpp>
#include <mpiddp/zero.hpp>

#include <gtest/gtest.h>

using mpiddp::assign_buckets;

TEST(Buckets, ReverseOrderWithFirstBucketCap) {
  // float32 params of 100, 200, 300, 400 elements (400..1600 bytes); first cap 1000 B, cap 2000 B.
  auto b = assign_buckets({100, 200, 300, 400}, std::vector<c10::ScalarType>(4, c10::kFloat), 2000, 1000);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].params, (std::vector<size_t>{3}));     // 1600 B alone: bigger than the first cap
  EXPECT_EQ(b[1].params, (std::vector<size_t>{2, 1}));  // 1200 + 800 = 2000 B
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

TEST(Buckets, GroupsShareNoBucketAndEachGoesByTheCaps) {
  // Parameters 0 (no group), 1-3 (group 0), 4-5 (group 1), 6 (no group); first cap 4 bytes, then
  // 12 bytes (three floats): a group's parameters fill buckets by the caps, never with another's.
  std::vector<c10::ScalarType> f(7, c10::kFloat);
  auto b = assign_buckets({1, 2, 1, 1, 1, 1, 1}, f, 12, 4, {-1, 0, 0, 0, 1, 1, -1});
  ASSERT_EQ(b.size(), 5u);
  EXPECT_EQ(b[0].params, (std::vector<size_t>{6}));  // in no group
  EXPECT_EQ(b[0].group, -1);
  EXPECT_EQ(b[1].params, (std::vector<size_t>{5, 4}));  // group 1 alone, though the cap holds three
  EXPECT_EQ(b[1].group, 1);
  EXPECT_EQ(b[2].params, (std::vector<size_t>{3, 2}));  // group 0: 8 B, then 2 floats more would be 16 > 12
  EXPECT_EQ(b[2].group, 0);
  EXPECT_EQ(b[3].params, (std::vector<size_t>{1}));
  EXPECT_EQ(b[3].group, 0);
  EXPECT_EQ(b[4].params, (std::vector<size_t>{0}));
  EXPECT_EQ(b[4].group, -1);
  EXPECT_THROW(assign_buckets({1, 2}, {c10::kFloat, c10::kFloat}, 8, 8, {0}), mpiddp::Error);
}

TEST(Buckets, BadCapsThrow) {
  EXPECT_THROW(assign_buckets({1}, {c10::kFloat}, 0, 1), mpiddp::Error);
  EXPECT_THROW(assign_buckets({1, 2}, {c10::kFloat}, 1, 1), mpiddp::Error);
}

TEST(BucketCap, TheReductionChoosesItUnlessTheUserDid) {
  // DDP keeps PyTorch's 25 MiB; ZeRO takes a 16th of the gradient within 1-25 MiB, so that a bucket
  // in flight stays small beside what sharding saves (the GPT of 10.9 M float parameters: 2.7 MiB).
  const int64_t mib = int64_t{1} << 20, gpt = int64_t{10'900'000} * 4;
  EXPECT_EQ(mpiddp::kAutoBucketCap, mpiddp::DdpOptions{}.bucket_cap_bytes);
  EXPECT_EQ(mpiddp::all_reduce()->bucket_cap(gpt), 25 * mib);
  for (int stage : {1, 2}) {
    const auto r = mpiddp::zero_reduction(stage);
    EXPECT_EQ(r->bucket_cap(gpt), gpt / 16) << "stage " << stage;
    EXPECT_EQ(r->bucket_cap(4 * mib), mib) << "stage " << stage;                // at least 1 MiB
    EXPECT_EQ(r->bucket_cap(int64_t{4} << 30), 25 * mib) << "stage " << stage;  // at most DDP's
  }
}
