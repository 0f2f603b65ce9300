// mpiddp::Error and the check macros every foreign call goes through.
#pragma once

#include <stdexcept>
#include <string>

namespace mpiddp {

/// The one exception type mpiddp throws: carries the rank that raised it, file:line and the
/// underlying library's own error text. what() is one line:
/// "[rank R] src/runtime/runtime.cpp:42: MPI_Comm_split_type(...) failed: <MPI's text>".
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line);
  Error(const std::string& message, const char* file, int line, int rank);

  /// The message without the rank and location prefix.
  const std::string& message() const noexcept { return message_; }
  /// World rank that raised it, or -1 before the runtime knew its rank.
  int rank() const noexcept { return rank_; }
  const std::string& file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  std::string message_;
  std::string file_;
  int line_;
  int rank_;
};

/// An error that every rank raises alike, at the same point, because the ranks decided it
/// together (a verdict broadcast by rank 0 or all-reduced). No rank is left in a collective, so
/// the job can end cleanly, without MPI_Abort, and rank 0 alone reports it.
class AgreedError : public Error {
 public:
  using Error::Error;
};

/// Thrown when a collective does not complete within its group's timeout (process_group.hpp). After it the group
/// is unusable (a collective may still be posted) and the job should abort.
class CollectiveTimeout : public Error {
 public:
  using Error::Error;
  /// Whether this rank is the one that reports the timeout (the lowest rank known to wait in the
  /// collective): the others end quietly so that the job's log holds one error line.
  bool reporter() const noexcept { return reporter_; }
  void set_reporter(bool r) noexcept { reporter_ = r; }

 private:
  bool reporter_ = true;
};
/// Thrown on every rank when ranks issued different collectives at the same sequence number.
class CollectiveMismatch : public Error {
 public:
  using Error::Error;
};

/// The world rank recorded by Runtime (or -1); used to stamp errors and log lines.
int current_rank() noexcept;
/// Set by Runtime once MPI has told it the rank.
void set_current_rank(int rank) noexcept;

}  // namespace mpiddp

#define MPIDDP_THROW(msg) throw ::mpiddp::Error((msg), __FILE__, __LINE__)
#define MPIDDP_THROW_AGREED(msg) throw ::mpiddp::AgreedError((msg), __FILE__, __LINE__)

/// Throws mpiddp::Error with `msg` (any expression convertible to std::string) unless `cond`.
#define MPIDDP_CHECK(cond, msg) \
  do {                          \
    if (!(cond)) {              \
      MPIDDP_THROW(msg);        \
    }                           \
  } while (0)
