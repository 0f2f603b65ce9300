// The one place where libtorch version differences are handled. Everything else includes
// this header and uses the names below, never TORCH_VERSION arithmetic of its own.
#pragma once

#include <torch/version.h>

#include <sstream>
#include <string>

#define MPIDDP_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace mpiddp::compat {

/// libtorch's version as "major.minor.patch".
inline const char* torch_version() { return TORCH_VERSION; }

namespace detail {
// libtorch 1.x keys torch::optim::Optimizer::state() by the text of the parameter's TensorImpl
// address (c10::guts::to_string, i.e. ostream <<); 2.x by the address itself.
inline std::string state_key(const void* impl, std::string*) {
  std::ostringstream s;
  s << impl;
  return s.str();
}
inline void* state_key(const void* impl, void**) { return const_cast<void*>(impl); }
}  // namespace detail

/// The key under which `state` (an Optimizer::state() map) holds the state of the parameter whose
/// TensorImpl is `impl` (p.unsafeGetTensorImpl()), whichever key type this libtorch uses.
template <class StateMap>
typename StateMap::key_type optimizer_state_key(const StateMap& /*state*/, const void* impl) {
  return detail::state_key(impl, static_cast<typename StateMap::key_type*>(nullptr));
}

}  // namespace mpiddp::compat
