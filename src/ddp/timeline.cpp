#include <mpiddp/error.hpp>
#include <mpiddp/timeline.hpp>

#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>

namespace mpiddp {

std::string Timeline::rank_path(const std::string& path, int rank) {
  const std::string r = std::to_string(rank);
  if (auto pos = path.find("%r"); pos != std::string::npos) return path.substr(0, pos) + r + path.substr(pos + 2);
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + ".rank" + r;
  return path.substr(0, dot) + ".rank" + r + path.substr(dot);
}

Timeline::Timeline(const std::string& path, int rank)
    : path_(path.empty() ? std::string() : rank_path(path, rank)), rank_(rank), epoch_(Clock::now()) {}

Timeline::~Timeline() {
  try {
    write();
  } catch (const std::exception& e) {
    std::cerr << "mpiddp: timeline not written: " << e.what() << std::endl;
  }
}

void Timeline::span(const std::string& name, const std::string& track, Clock::time_point begin, Clock::time_point end) {
  if (!enabled()) return;
  const double ts = std::chrono::duration<double, std::micro>(begin - epoch_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - begin).count();
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({name, track, ts, dur});
}

void Timeline::write() {
  if (!enabled() || written_) return;
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json events = nlohmann::json::array();
  // One process per rank, one thread per track: compute on tid 0, communication on tid 1.
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  for (const auto& [track, tid] : {std::pair<const char*, int>{"compute", 0}, {"comm", 1}}) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", tid}, {"args", {{"name", track}}}});
  }
  for (const auto& e : events_) {
    events.push_back({{"name", e.name},
                      {"cat", e.track},
                      {"ph", "X"},
                      {"ts", e.ts_us},
                      {"dur", e.dur_us},
                      {"pid", rank_},
                      {"tid", e.track == "comm" ? 1 : 0}});
  }
  std::ofstream out(path_);
  MPIDDP_CHECK(out.good(), "cannot write timeline '" + path_ + "'");
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  MPIDDP_CHECK(out.good(), "error writing timeline '" + path_ + "'");
  written_ = true;
}

ScopedSpan::ScopedSpan(Timeline* timeline, std::string name, std::string track)
    : timeline_(timeline && timeline->enabled() ? timeline : nullptr),
      name_(std::move(name)),
      track_(std::move(track)),
      begin_(Timeline::Clock::now()) {}

ScopedSpan::~ScopedSpan() {
  if (timeline_) timeline_->span(name_, track_, begin_, Timeline::Clock::now());
}

}  // namespace mpiddp
