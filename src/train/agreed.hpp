// For work whose failure every rank reaches alike (checks of what every rank holds: a snapshot's
// catalog, the same samples): an Error it raises is every rank's verdict, so it is rethrown as an
// AgreedError (reported once, every rank ends cleanly). A timeout, or an error already agreed,
// goes on as it is: no other rank is known to share it.
#pragma once

#include <mpiddp/error.hpp>
#include <mpiddp/process_group.hpp>

#include <utility>

namespace mpiddp::detail {

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
