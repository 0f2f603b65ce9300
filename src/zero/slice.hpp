#pragma once
// A rank's slice of a bucket under ZeRO, and the parts of the bucket's parameters that fall in it:
// the one rule ZeroOptimizer (the slices it steps) and ShardedUnits (the slices it keeps) share.

#include <mpiddp/reduction.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mpiddp::detail {

/// The first element of rank `rank`'s slice of a bucket (padded / ranks elements each).
inline int64_t slice_begin(const BucketLayout& layout, int rank, int ranks) { return rank * (layout.padded / ranks); }

/// visit(parameter, first element in it, first element in the bucket, count) for every parameter
/// of `layout` with elements in rank `rank`'s slice, in bucket order. `params`: DDP's parameters.
template <class Visit>
void for_each_in_slice(const BucketLayout& layout, const std::vector<torch::Tensor>& params, int rank, int ranks,
                       Visit&& visit) {
  const int64_t lo = slice_begin(layout, rank, ranks), hi = lo + layout.padded / ranks;
  for (size_t s = 0; s < layout.params.size(); ++s) {
    const size_t i = layout.params[s];
    const int64_t begin = std::max(lo, layout.offsets[s]);
    const int64_t end = std::min(hi, layout.offsets[s] + params[i].numel());
    if (begin < end) visit(i, begin - layout.offsets[s], begin, end - begin);
  }
}

}  // namespace mpiddp::detail
