// Test helpers that undo what they do when they go: an environment variable set for a scope, and a
// fresh temporary directory removed with everything in it.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace mpiddp::testing {

/// Sets `name` to `value` while it lives; unset after.
struct EnvGuard {
  std::string name;
  EnvGuard(const std::string& n, const std::string& v) : name(n) { setenv(n.c_str(), v.c_str(), 1); }
  ~EnvGuard() { unsetenv(name.c_str()); }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
};

/// A new directory under /tmp named after `prefix`, removed with its contents when it goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "mpiddp-test") {
    std::string name = "/tmp/" + prefix + "-XXXXXX";
    path_ = mkdtemp(name.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& f) const { return (std::filesystem::path(path_) / f).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace mpiddp::testing
