// Agreeing on an error across ranks: the one mechanism every "any rank's failure is every rank's
// error" goes through.
//
// Cross-rank contract: a rank that fails keeps its reason (LocalFailure) and goes on through every
// collective call the others make, so no rank waits in one that another left; then all ranks reach
// the verdict together (any_rank_failed: one all-reduce) and, when some rank failed, learn why
// (throw_agreed_failure: the reasons all-gathered, the lowest failing rank's thrown on every rank as
// the same AgreedError). A CollectiveTimeout is never kept: another rank is gone, no agreement can
// follow. Where every rank reaches the same verdict by construction (checks of what every rank
// holds alike), as_agreed marks the error agreed without any collective.
#pragma once

#include <mpiddp/error.hpp>
#include <mpiddp/runtime.hpp>

#include <mpi.h>

#include <exception>
#include <string>
#include <utility>

#include "common/text.hpp"

namespace mpiddp::detail {

/// This rank's first failure, kept while the rank goes on through the collectives that follow.
class LocalFailure {
 public:
  /// Runs `work`; an exception it throws is kept as `describe(e)` (default: reason_of) unless a
  /// failure is kept already. A CollectiveTimeout goes on: it is not this rank's own failure.
  template <class Work, class Describe = std::string (*)(const std::exception&)>
  void run(Work&& work, Describe describe = &reason_of) {
    try {
      std::forward<Work>(work)();
    } catch (const CollectiveTimeout&) {
      throw;
    } catch (const std::exception& e) {
      note(describe(e));
    }
  }
  /// Keeps `why` unless a failure is kept already ("" keeps nothing).
  void note(std::string why) {
    if (reason_.empty()) reason_ = std::move(why);
  }
  bool failed() const { return !reason_.empty(); }
  const std::string& reason() const { return reason_; }
  /// The kept reason, leaving none.
  std::string take() { return std::exchange(reason_, std::string()); }

 private:
  std::string reason_;
};

/// Whether any rank of `comm` kept a failure. Collective (one all-reduce).
inline bool any_rank_failed(MPI_Comm comm, const LocalFailure& mine) { return !all_ok(comm, !mine.failed()); }

/// Returns when no rank of `comm` failed; else throws on every rank the same AgreedError: `context`
/// then the reason of the lowest rank that failed. Collective (an all-reduce; after a failure an
/// all-gather of the reasons).
inline void throw_agreed_failure(MPI_Comm comm, const LocalFailure& mine, const std::string& context = "") {
  if (!any_rank_failed(comm, mine)) return;
  for (const auto& why : allgather_strings(comm, mine.reason())) {
    if (!why.empty()) MPIDDP_THROW_AGREED(context + why);
  }
}

/// Runs `work` whose failure every rank reaches alike (checks of what every rank holds: a
/// snapshot's catalog, the same samples): an Error it raises is every rank's verdict, so it is
/// rethrown as an AgreedError (reported once, every rank ends cleanly). A timeout, or an error
/// already agreed, goes on as it is: no other rank is known to share it. No collective.
template <class Work>
void as_agreed(Work&& work) {
  try {
    std::forward<Work>(work)();
  } catch (const AgreedError&) {
    throw;
  } catch (const CollectiveTimeout&) {
    throw;
  } catch (const Error& e) {
    MPIDDP_THROW_AGREED(e.message());
  }
}

}  // namespace mpiddp::detail
