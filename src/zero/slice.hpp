#pragma once
// A rank's slice of a bucket under ZeRO, and the parts of the bucket's parameters that fall in it:
// the one rule ZeroOptimizer (the slices it steps) and ShardedUnits (the slices it keeps) share.
// A slice is the even share (common/even_share.hpp) of the bucket's padded buffer, whose length is a
// multiple of the ranks: every slice holds padded / ranks elements.

#include <mpiddp/reduction.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/even_share.hpp"

namespace mpiddp::detail {

/// Rank `rank`'s slice of a bucket: elements [r * padded / ranks, (r + 1) * padded / ranks).
inline Share slice_of(const BucketLayout& layout, int rank, int ranks) { return share_of(layout.padded, rank, ranks); }

/// The first element of rank `rank`'s slice of a bucket (padded / ranks elements each).
inline int64_t slice_begin(const BucketLayout& layout, int rank, int ranks) {
  return slice_of(layout, rank, ranks).first;
}

/// The elements of every rank's slice of a bucket: padded / ranks.
inline int64_t slice_numel(const BucketLayout& layout, int ranks) { return slice_of(layout, 0, ranks).count; }

/// visit(parameter, first element in it, first element in the bucket, count) for every parameter
/// of `layout` with elements in rank `rank`'s slice, in bucket order. `params`: DDP's parameters.
template <class Visit>
void for_each_in_slice(const BucketLayout& layout, const std::vector<torch::Tensor>& params, int rank, int ranks,
                       Visit&& visit) {
  const Share slice = slice_of(layout, rank, ranks);
  const int64_t lo = slice.first, hi = slice.end();
  for (size_t s = 0; s < layout.params.size(); ++s) {
    const size_t i = layout.params[s];
    const int64_t begin = std::max(lo, layout.offsets[s]);
    const int64_t end = std::min(hi, layout.offsets[s] + params[i].numel());
    if (begin < end) visit(i, begin - layout.offsets[s], begin, end - begin);
  }
}

}  // namespace mpiddp::detail
