// Internal: small text helpers for error messages.
#pragma once

#include <mpiddp/error.hpp>

#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <cstdint>
#include <exception>
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

/// Whether `s` ends with `tail`.
inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

/// `items` with `separator` between them ("a, b, c").
inline std::string joined(const std::vector<std::string>& items, const std::string& separator) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? separator : "") + items[i];
  return s;
}

/// "unknown <what> '<name>' (a, b, c)": the one wording of a name that is none of `names`.
inline std::string unknown_name(const std::string& what, const std::string& name,
                                const std::vector<std::string>& names) {
  return "unknown " + what + " '" + name + "' (" + joined(names, ", ") + ")";
}

/// `text` cut at each `separator`, empty pieces dropped ("a,,b" -> a, b).
inline std::vector<std::string> split_list(const std::string& text, char separator = ',') {
  std::vector<std::string> out;
  size_t from = 0;
  while (from <= text.size()) {
    const size_t to = std::min(text.find(separator, from), text.size());
    if (to > from) out.push_back(text.substr(from, to - from));
    from = to + 1;
  }
  return out;
}

/// The first line of a (library's multi-line) message.
inline std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

/// Why `e` was thrown, for a message that adds its own context: an mpiddp::Error's message
/// (without the rank prefix and source location), else the first line of what().
inline std::string reason_of(const std::exception& e) {
  if (const auto* ours = dynamic_cast<const Error*>(&e)) return ours->message();
  return first_line(e.what());
}

}  // namespace mpiddp::detail
