// `mpiddp bench`: collective bandwidth with nccl-tests' semantics. The arithmetic lives here as
// pure functions so the unit tests can check it against the formulas.
#pragma once

#include <mpiddp/process_group.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mpiddp::app::bench {

/// "8", "64K", "256M", "1G" (powers of 1024, as nccl-tests reads them) -> bytes. Throws
/// mpiddp::Error on anything else.
int64_t parse_size(const std::string& text);

/// Bytes per second in GB/s (1e9 bytes): S / t.
double algbw_gbps(int64_t bytes, double seconds);

/// One point of the sweep: S (bytes of the whole array, as in nccl-tests) and elements.
struct SizePoint {
  int64_t bytes = 0;  ///< S as nccl-tests reports it, after rounding to whole elements per rank
  int64_t count = 0;  ///< elements of the whole array (allgather: of the output)
};

/// The sizes from min to max bytes, multiplying by `factor`, rounded down so every rank holds
/// whole elements (allgather, reduce_scatter and alltoall split the array into n parts); sizes
/// that round to zero elements are dropped.
std::vector<SizePoint> sweep(Collective c, int64_t min_bytes, int64_t max_bytes, double factor, int element_size,
                             int n);

/// p-th percentile (0..100) of `values` by nearest rank; NaN for an empty list.
double percentile(std::vector<double> values, double p);

}  // namespace mpiddp::app::bench
