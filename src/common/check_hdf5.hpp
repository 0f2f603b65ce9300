// Internal: check macro for HDF5 calls. HDF5 returns negative ids/statuses on failure and keeps
// its own error stack; the innermost messages become the error text.
#pragma once

#include <mpiddp/error.hpp>

#include <hdf5.h>

#include <string>

namespace mpiddp::detail {

/// HDF5's current error stack as one line ("H5Fopen: unable to open file: ..."), then cleared.
std::string hdf5_error_text();

}  // namespace mpiddp::detail

#define MPIDDP_CHECK_HDF5(call)                                                                         \
  ([&]() {                                                                                              \
    auto mpiddp_h5_ = (call);                                                                           \
    if (mpiddp_h5_ < 0) {                                                                               \
      throw ::mpiddp::Error(std::string(#call) + " failed: " + ::mpiddp::detail::hdf5_error_text(),     \
                            __FILE__, __LINE__);                                                        \
    }                                                                                                   \
    return mpiddp_h5_;                                                                                  \
  }())
