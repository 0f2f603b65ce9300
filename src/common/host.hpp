// Internal: this process's wall clock and host name, for file names, log lines and snapshots.
#pragma once

#include <unistd.h>

#include <chrono>
#include <climits>
#include <string>

namespace mpiddp::detail {

/// Seconds since the Unix epoch (wall clock).
inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// gethostname(), or "unknown-host" when it fails.
inline std::string local_hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof name) != 0) return "unknown-host";
  name[HOST_NAME_MAX] = '\0';
  return name;
}

}  // namespace mpiddp::detail
