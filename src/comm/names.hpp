// Internal: the reductions and element types the process groups take, listed from the tables that
// name them (process_group.cpp: to_string, parse_reduce_op, dtype_name, parse_dtype), for help texts
// and for the tests that loop over them.
#pragma once

#include <mpiddp/process_group.hpp>

#include <vector>

namespace mpiddp::detail {

/// Every ReduceOp, in the order their names are listed (sum, avg, min, max).
std::vector<ReduceOp> reduce_ops();
/// The element types the groups take (float32, float64, bfloat16, float16, int32, int64).
std::vector<c10::ScalarType> collective_dtypes();

}  // namespace mpiddp::detail
