// Internal: small text helpers for error messages.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mpiddp::detail {

/// "[128, 20]"
inline std::string shape_text(c10::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// "rank 2" or "ranks 0,2"
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

/// The first line of a (library's multi-line) message.
inline std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace mpiddp::detail
