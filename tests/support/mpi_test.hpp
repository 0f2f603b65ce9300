// Helpers for MPI tests. Contract: an assertion is made on a verdict all ranks share, so no rank
// returns early from a test and leaves the others inside a collective.
#pragma once

#include <mpiddp/comm.hpp>
#include <mpiddp/runtime.hpp>

#include <gtest/gtest.h>

namespace mpiddp::testing {

/// The process's Runtime, created by the MPI gtest main before any test runs.
Runtime& runtime();

/// A process group of `backend` in check mode (timeout 120 s), created on first use and kept until
/// the run ends (collective: every rank must ask for the same backends in the same order).
ProcessGroup& checked_group(const std::string& backend);

/// True on every rank iff `local` is true on every rank.
inline bool on_all_ranks(bool local) { return all_ok(runtime().world(), local); }

}  // namespace mpiddp::testing

/// Asserts `cond` on every rank after the ranks have agreed: fails everywhere if any rank failed.
#define MPIDDP_EXPECT_ALL(cond) EXPECT_TRUE(::mpiddp::testing::on_all_ranks(static_cast<bool>(cond))) << #cond
#define MPIDDP_ASSERT_ALL(cond) ASSERT_TRUE(::mpiddp::testing::on_all_ranks(static_cast<bool>(cond))) << #cond
