// The table of collectives against nccl-tests' formulas, and the collective harness that `mpiddp
// bench` and tests/mpi/test_comm_mpi.cpp run (comm/collective_harness.hpp): a row per collective,
// its reference values against values computed by hand and against the collectives' definitions
// at one rank, its buffers and its tolerance rule. The backends are held to it in test_comm_mpi.
#include <mpiddp/collective.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/process_group.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "comm/collective_harness.hpp"
#include "comm/names.hpp"

TEST(Collectives, TableFollowsTheEnumAndNcclTestsFormulas) {
  using mpiddp::Collective;
  // Row i is the enum's value i (traits() indexes by it), named as bench and the errors spell it.
  const auto& all = mpiddp::collectives();
  ASSERT_FALSE(all.empty());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto c = static_cast<Collective>(i);
    const auto& t = mpiddp::traits(c);
    EXPECT_EQ(&t, &all[i]);
    EXPECT_EQ(t.kind, c);
    EXPECT_EQ(mpiddp::parse_collective(t.name), c);
    EXPECT_EQ(mpiddp::to_string(c), t.name);
  }
  for (int n : {1, 2, 3, 4, 8}) {  // nccl-tests' PERFORMANCE.md: busbw = algbw x factor
    const double ring = static_cast<double>(n - 1) / n;
    EXPECT_DOUBLE_EQ(mpiddp::traits(Collective::kAllreduce).bus_factor(n), 2 * ring);
    EXPECT_DOUBLE_EQ(mpiddp::traits(Collective::kAllgather).bus_factor(n), ring);
    EXPECT_DOUBLE_EQ(mpiddp::traits(Collective::kReduceScatter).bus_factor(n), ring);
    EXPECT_DOUBLE_EQ(mpiddp::traits(Collective::kAlltoall).bus_factor(n), ring);
    EXPECT_DOUBLE_EQ(mpiddp::traits(Collective::kBroadcast).bus_factor(n), 1.0);
  }
  // S, the whole array: the output of an allgather, the input of the others.
  EXPECT_EQ(mpiddp::traits(Collective::kAllgather).array_elements(5, 20), 20);
  EXPECT_EQ(mpiddp::traits(Collective::kReduceScatter).array_elements(20, 5), 20);
  EXPECT_EQ(mpiddp::traits(Collective::kAllreduce).array_elements(7, 7), 7);
  // MPI's own signatures: the reductions take an op, broadcast a root.
  EXPECT_TRUE(mpiddp::traits(Collective::kAllreduce).reduces && mpiddp::traits(Collective::kReduceScatter).reduces);
  EXPECT_FALSE(mpiddp::traits(Collective::kAllgather).reduces || mpiddp::traits(Collective::kAlltoall).reduces);
  EXPECT_TRUE(mpiddp::traits(Collective::kBroadcast).rooted);
  EXPECT_FALSE(mpiddp::traits(Collective::kBarrier).has_data());
}

TEST(CollectiveHarness, EveryCollectiveHasItsRow) {
  // A call for every collective; an input and a reference for each that moves data, none for one without.
  for (const auto& t : mpiddp::collectives()) {
    const auto& row = mpiddp::detail::harness(t.kind);
    EXPECT_NE(row.start, nullptr) << t.name;
    EXPECT_EQ(row.input != nullptr, t.has_data()) << t.name;
    EXPECT_EQ(row.expected != nullptr, t.has_data()) << t.name;
  }
}

TEST(CollectiveHarness, PatternAndReductionsByHand) {
  using mpiddp::ReduceOp;
  using mpiddp::detail::pattern;
  using mpiddp::detail::reduced_pattern;
  const auto values = [](std::vector<double> v) { return torch::tensor(v, torch::kDouble); };
  // (i + 3r) % 5 + 1
  EXPECT_TRUE(torch::equal(pattern(0, 0, 5), values({1, 2, 3, 4, 5})));
  EXPECT_TRUE(torch::equal(pattern(1, 0, 5), values({4, 5, 1, 2, 3})));
  EXPECT_TRUE(torch::equal(pattern(2, 3, 2), values({5, 1})));
  // Three ranks at i = 0, 1: {1, 4, 2} and {2, 5, 3}.
  EXPECT_TRUE(torch::equal(reduced_pattern(ReduceOp::kSum, 3, 0, 2), values({7, 10})));
  EXPECT_TRUE(torch::equal(reduced_pattern(ReduceOp::kMin, 3, 0, 2), values({1, 2})));
  EXPECT_TRUE(torch::equal(reduced_pattern(ReduceOp::kMax, 3, 0, 2), values({4, 5})));
  EXPECT_TRUE(torch::allclose(reduced_pattern(ReduceOp::kAvg, 3, 0, 2), values({7.0 / 3, 10.0 / 3})));
  EXPECT_TRUE(torch::equal(reduced_pattern(ReduceOp::kSum, 1, 4, 3), pattern(0, 4, 3)));
}

// Two ranks, a whole array of 4, seen by rank 1: rank 0 holds 1 2 3 4, rank 1 holds 4 5 1 2.
TEST(CollectiveHarness, ExpectedOutputsByHand) {
  using mpiddp::Collective;
  const std::vector<std::pair<Collective, std::vector<double>>> by_hand = {
      {Collective::kAllreduce, {5, 7, 4, 6}},  // sum
      {Collective::kBroadcast, {1, 2, 3, 4}},  // root 0
      {Collective::kAllgather, {1, 2, 4, 5}},  // each rank's first half
      {Collective::kReduceScatter, {4, 6}},    // sum of the second halves
      {Collective::kAlltoall, {3, 4, 1, 2}},   // each rank's second half
  };
  for (const auto& [c, want] : by_hand) {
    const auto got = mpiddp::detail::harness(c).expected(1, 2, 4, {mpiddp::ReduceOp::kSum, 0});
    EXPECT_TRUE(torch::equal(got, torch::tensor(want, torch::kDouble))) << mpiddp::to_string(c) << ": " << got;
  }
  EXPECT_EQ(mpiddp::detail::harness(Collective::kBarrier).expected, nullptr);
}

// Whatever a collective does, at one rank its output is its input (broadcast from rank 0 itself), and
// at any rank count the reference has the output's length and the input function the input's.
TEST(CollectiveHarness, ReferencesFitTheBuffersAndAreTheIdentityAtOneRank) {
  const auto options = torch::TensorOptions().dtype(torch::kDouble);
  for (const auto& t : mpiddp::collectives()) {
    if (!t.has_data()) continue;
    const auto& row = mpiddp::detail::harness(t.kind);
    for (auto op : {mpiddp::ReduceOp::kSum, mpiddp::ReduceOp::kAvg, mpiddp::ReduceOp::kMin, mpiddp::ReduceOp::kMax}) {
      const int64_t elements = 12;  // splits in 1..4 parts
      for (int n = 1; n <= 4; ++n) {
        for (int r = 0; r < n; ++r) {
          const mpiddp::detail::CollectiveArgs args{op, n - 1};
          const auto b = mpiddp::detail::make_buffers(t.kind, elements, options, false, r, n);
          EXPECT_EQ(row.expected(r, n, elements, args).numel(), b.output.numel()) << t.name << " n " << n;
          EXPECT_EQ(row.input(r, b.input.numel(), args).numel(), b.input.numel()) << t.name << " n " << n;
        }
      }
      const mpiddp::detail::CollectiveArgs alone{op, 0};
      EXPECT_TRUE(torch::equal(row.expected(0, 1, elements, alone), row.input(0, elements, alone))) << t.name;
    }
  }
}

TEST(CollectiveHarness, BuffersAliasInPlaceOnly) {
  const auto options = torch::TensorOptions().dtype(torch::kFloat);
  for (const auto& t : mpiddp::collectives()) {
    const auto in_place = mpiddp::detail::make_buffers(t.kind, 6, options, true, 1, 3);
    const auto apart = mpiddp::detail::make_buffers(t.kind, 6, options, false, 1, 3);
    if (!t.has_data()) {
      EXPECT_FALSE(in_place.input.defined() || in_place.output.defined()) << t.name;
      continue;
    }
    EXPECT_EQ(t.array_elements(in_place.input.numel(), in_place.output.numel()), 6) << t.name;
    EXPECT_EQ(t.array_elements(apart.input.numel(), apart.output.numel()), 6) << t.name;
    EXPECT_TRUE(in_place.input.is_alias_of(in_place.output)) << t.name;
    EXPECT_FALSE(apart.input.is_alias_of(apart.output)) << t.name;
    // Rank 1's slice of a split array starts at its part.
    if (in_place.input.numel() != in_place.output.numel()) {
      const auto& whole = in_place.input.numel() > in_place.output.numel() ? in_place.input : in_place.output;
      const auto& slice = in_place.input.numel() > in_place.output.numel() ? in_place.output : in_place.input;
      EXPECT_EQ(slice.data_ptr<float>(), whole.data_ptr<float>() + 2) << t.name;
    }
  }
  EXPECT_THROW(mpiddp::detail::make_buffers(mpiddp::Collective::kAllgather, 7, options, false, 0, 2), mpiddp::Error);
}

TEST(CollectiveHarness, ToleranceOnlyForAverages) {
  for (const auto& t : mpiddp::collectives()) {
    for (auto dtype : mpiddp::detail::collective_dtypes()) {
      for (auto op : {mpiddp::ReduceOp::kSum, mpiddp::ReduceOp::kMin, mpiddp::ReduceOp::kMax}) {
        EXPECT_EQ(mpiddp::detail::tolerance(t.kind, dtype, op), 0.0) << t.name;
      }
      const double avg = mpiddp::detail::tolerance(t.kind, dtype, mpiddp::ReduceOp::kAvg);
      if (!t.reduces) {
        EXPECT_EQ(avg, 0.0) << t.name;
      }
    }
  }
  const auto allreduce = mpiddp::Collective::kAllreduce;
  EXPECT_EQ(mpiddp::detail::tolerance(allreduce, c10::kBFloat16, mpiddp::ReduceOp::kAvg), 1e-2);
  EXPECT_EQ(mpiddp::detail::tolerance(allreduce, c10::kHalf, mpiddp::ReduceOp::kAvg), 1e-3);
  EXPECT_EQ(mpiddp::detail::tolerance(allreduce, c10::kFloat, mpiddp::ReduceOp::kAvg), 1e-6);
  EXPECT_EQ(mpiddp::detail::tolerance(allreduce, c10::kDouble, mpiddp::ReduceOp::kAvg), 1e-12);
}

TEST(CollectiveHarness, CountWrongIsRelativeAndCountsALengthMismatch) {
  using mpiddp::detail::count_wrong;
  const auto values = [](std::vector<double> v) { return torch::tensor(v, torch::kDouble); };
  EXPECT_EQ(count_wrong(values({1, 2, 3}), values({1, 2, 3}), 0.0), 0);
  EXPECT_EQ(count_wrong(values({1, 2, 4}), values({1, 2, 3}), 0.0), 1);
  // Relative to max(1, |expected|): at 1e-3, 0.0005 off 0.5 passes, 0.002 off 1000 too, 0.01 off 2 not.
  EXPECT_EQ(count_wrong(values({0.5005, 1000.002, 2.01}), values({0.5, 1000, 2}), 1e-3), 1);
  // Unwritten elements are wrong; so is a short output, by one more.
  EXPECT_EQ(count_wrong(values({mpiddp::detail::kUnwritten, 2}), values({1, 2}), 1e-2), 1);
  EXPECT_EQ(count_wrong(values({1, 2}), values({1, 2, 3}), 0.0), 1);
  EXPECT_EQ(count_wrong(torch::tensor({1, 2}, torch::kBFloat16), values({1, 2}), 0.0), 0);
}
