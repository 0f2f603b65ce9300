// The one place where libtorch version differences are handled. Everything else includes
// this header and uses the names below, never TORCH_VERSION arithmetic of its own.
#pragma once

#include <torch/version.h>

#define MPIDDP_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace mpiddp::compat {

/// libtorch's version as "major.minor.patch".
inline const char* torch_version() { return TORCH_VERSION; }

}  // namespace mpiddp::compat
