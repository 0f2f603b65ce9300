// Internal: check macros for foreign calls. Each throws mpiddp::Error with the rank,
// file:line, the call's text and the library's own error string.
#pragma once

#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>

#include <string>

namespace mpiddp::detail {

[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
/// The text MPI_Error_string gives for `code`.
std::string mpi_error_text(int code);

}  // namespace mpiddp::detail

#define MPIDDP_CHECK_MPI(call)                                                  \
  do {                                                                          \
    int mpiddp_rc_ = (call);                                                    \
    if (mpiddp_rc_ != MPI_SUCCESS) {                                            \
      ::mpiddp::detail::throw_mpi_error(mpiddp_rc_, #call, __FILE__, __LINE__); \
    }                                                                           \
  } while (0)
