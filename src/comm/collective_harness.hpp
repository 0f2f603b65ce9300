// Internal: the one harness that runs a collective and checks its output, as nccl-tests' `struct
// testColl`. A collective's harness row (its ProcessGroup call, input and expected values) is part
// of its row in the table of collectives (src/comm/collective.cpp), beside the traits every backend
// reads. `mpiddp bench` (its #wrong column) and tests/mpi/test_comm_mpi.cpp both run collectives
// through it, so neither switches over collectives.
//
// Contract: the expected output is a closed form of the input pattern and the ReduceOp, computed
// on each rank without any communication, so a backend is checked against an independent reference,
// never against another backend's output. Every rank calls verify() with the same collective,
// arguments and element count (it issues one collective on the group).
//
// Not public: a test and benchmark harness, which would bring torch types and a test pattern into
// include/mpiddp/collective.hpp, a torch-free header every backend reads.
#pragma once

#include <mpiddp/collective.hpp>
#include <mpiddp/process_group.hpp>

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace mpiddp::detail {

/// What a collective takes besides its buffers.
struct CollectiveArgs {
  ReduceOp op = ReduceOp::kSum;  ///< read by reductions only
  int root = 0;                  ///< read by rooted collectives only
};

/// A collective's input and output. In place, they alias as nccl-tests' do (ProcessGroup's
/// convention): the same tensor, or for allgather the input is this rank's slice of the output, for
/// reduce_scatter the output is this rank's slice of the input. Both undefined for a barrier.
struct CollectiveBuffers {
  torch::Tensor input, output;
};

/// The element counts of a rank's part the tests check every collective at: one element, a few (odd:
/// no vector width divides it), more than a page of floats (its check waits on the device).
inline const std::vector<int64_t> kCheckCounts = {1, 7, 1031};

/// What an output element holds before the collective writes it; no pattern value nor any
/// reduction of them equals it, so an element left unwritten counts as wrong.
constexpr double kUnwritten = -7;

/// The harness's part of a collective's row: everything about it that needs torch or a ProcessGroup.
struct HarnessRow {
  /// Issues the collective on `pg` through its ProcessGroup method.
  WorkHandle (*start)(ProcessGroup& pg, const CollectiveBuffers& b, const CollectiveArgs& a);
  /// Rank r's input of `numel` elements (float64 on the CPU): the pattern, or kUnwritten where the
  /// collective does not read it (broadcast off the root); null for a collective without data.
  torch::Tensor (*input)(int r, int64_t numel, const CollectiveArgs& a);
  /// Rank r's exact output over n ranks (float64 on the CPU) when the whole array has `elements`
  /// elements (nccl-tests' S / element size; CollectiveTraits::array_elements); null for a
  /// collective without data.
  torch::Tensor (*expected)(int r, int n, int64_t elements, const CollectiveArgs& a);
};

/// The harness's part of `c`'s row in the table of collectives.
const HarnessRow& harness(Collective c);

/// The shared input pattern, float64 on the CPU: rank r's element at global index i (first <= i <
/// first + count) is (i + 3r) % 5 + 1. Small integers that every dtype holds exactly, as it holds
/// their minima, maxima and sums (at most 5n: exact in bfloat16 up to 51 ranks).
torch::Tensor pattern(int r, int64_t first, int64_t count);
/// `op` over ranks 0..n-1 of pattern(r, first, count), element by element (avg: the sum / n).
torch::Tensor reduced_pattern(ReduceOp op, int n, int64_t first, int64_t count);

/// Largest relative error (against max(1, |expected|)) allowed in an element of `c`'s output on
/// `dtype` with `op`: none, but for averages, which are not integers: one rounding of the dtype.
double tolerance(Collective c, c10::ScalarType dtype, ReduceOp op);

/// Zeroed buffers of `c` for a whole array of `elements` elements (a multiple of n where
/// traits(c).splits()), on rank `rank` of n, aliased in place as CollectiveBuffers says.
CollectiveBuffers make_buffers(Collective c, int64_t elements, const torch::TensorOptions& options, bool in_place,
                               int rank, int n);

/// Elements of `got` further than `tol` (relative, as tolerance() says) from `expected`; a length
/// mismatch counts one more.
int64_t count_wrong(const torch::Tensor& got, const torch::Tensor& expected, double tol);

/// Fills `b` (every output element kUnwritten, then this rank's input), runs `c` once on `pg`,
/// waits (wait_on_device() when `on_device`: the check's read then queues behind it on the device),
/// and returns the number of this rank's output elements that differ from the expected values.
int64_t verify(ProcessGroup& pg, Collective c, const CollectiveBuffers& b, const CollectiveArgs& a,
               bool on_device = false);

}  // namespace mpiddp::detail
