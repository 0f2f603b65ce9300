// The even share: how mpiddp splits a run of elements among ranks when every rank takes part alike.
// Rank r of n owns elements [total * r / n, total * (r + 1) / n): contiguous, in rank order, sizes
// differing by at most one, and the same on every rank that computes it (no communication needed).
// Its users: snapshot writes and verification (snapshot/parallel_snapshot.cpp), ZeRO's slices of a
// bucket padded to a multiple of the ranks (zero/slice.hpp, and stage 1's owned gradient in
// ddp/reduction.cpp: there every share is padded / n), the evaluation's slices of the test set.
// largest_share: the padding to a multiple of the ranks (ddp/averaging.hpp's round_up), the memory
// plan's 1/N of the sharded bytes, the evaluation's lockstep.
#pragma once

#include <cstdint>

namespace mpiddp::detail {

/// Elements [first, first + count) of a run.
struct Share {
  int64_t first = 0;
  int64_t count = 0;
  int64_t end() const { return first + count; }
};

/// Rank `rank` of `ranks`' even share of `total` elements.
inline Share share_of(int64_t total, int rank, int ranks) {
  const int64_t first = total * rank / ranks;
  return {first, total * (rank + 1) / ranks - first};
}

/// The most elements any rank's even share of `total` holds: ceil(total / ranks).
inline int64_t largest_share(int64_t total, int ranks) { return (total + ranks - 1) / ranks; }

}  // namespace mpiddp::detail
