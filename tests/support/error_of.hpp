// Test helper: the message of the mpiddp::Error that `f` throws ("" when it throws none), so a
// test can assert on what the user would read.
#pragma once

#include <mpiddp/error.hpp>

#include <functional>
#include <string>

namespace mpiddp::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const mpiddp::Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace mpiddp::testing
