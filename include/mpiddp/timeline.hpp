// Timeline: per-rank Chrome-trace JSON (chrome://tracing, Perfetto) of forward, backward, each
// bucket's all-reduce and the optimizer step, so overlap can be seen.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mpiddp {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  /// Disabled when `path` is empty. "%r" in `path` becomes the rank; otherwise ".rank<r>" is
  /// inserted before the extension (trace.json -> trace.rank0.json).
  Timeline(const std::string& path, int rank);
  ~Timeline();  ///< writes the file (errors are reported on stderr: destructors never throw)
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  /// A complete span on `track` ("compute", "comm"); thread-safe.
  void span(const std::string& name, const std::string& track, Clock::time_point begin, Clock::time_point end);
  /// Writes the file now (throws mpiddp::Error if it cannot).
  void write();

  /// The per-rank path for `path` (see the constructor).
  static std::string rank_path(const std::string& path, int rank);

 private:
  struct Event {
    std::string name, track;
    double ts_us, dur_us;
  };
  std::string path_;
  int rank_;
  Clock::time_point epoch_;
  std::mutex mu_;
  std::vector<Event> events_;
  bool written_ = false;
};

/// Records a span on scope exit when the timeline is enabled.
class ScopedSpan {
 public:
  ScopedSpan(Timeline* timeline, std::string name, std::string track = "compute");
  ~ScopedSpan();

 private:
  Timeline* timeline_;
  std::string name_, track_;
  Timeline::Clock::time_point begin_;
};

}  // namespace mpiddp
