#include "runtime/stall.hpp"

#include "common/text.hpp"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <map>
#include <thread>

namespace mpiddp::detail {
namespace {

constexpr int kStallTag = 0x57a1;

}  // namespace

StallMonitor::StallMonitor(MPI_Comm control, int rank, int size, std::chrono::milliseconds warning)
    : comm_(control), rank_(rank), size_(size), latest_(static_cast<size_t>(size)), warning_(warning) {}

void StallMonitor::on_wait(const WaitSite& site, std::chrono::steady_clock::duration waited) {
  if (warning_.count() <= 0) return;
  if (warned_seq_ != site.seq) {
    warned_seq_ = site.seq;
    next_warning_ = warning_;
  }
  // Announce half a period early, so that by the warning the other waiting ranks' notices are in.
  if (waited >= next_warning_ / 2) announce(site);  // once per wait
  if (waited < next_warning_) return;
  next_warning_ += warning_;
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(waited).count();
  const std::string line = "mpiddp: warning: [rank " + std::to_string(rank_) + "] " + site.describe() + " has waited " +
                           std::to_string(seconds) + " s: " + behind(site) + "\n";
  std::cerr << line << std::flush;  // one write: lines of ranks sharing a stream stay whole
}

StallMonitor::~StallMonitor() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (recv_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&recv_);
    MPI_Request_free(&recv_);
  }
  for (auto& s : sent_) {
    for (auto& r : s.requests) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // eager sends complete on their own
    }
    s.notice.release();  // a send still in flight may read it: leaked on purpose (a stalled job)
  }
}

void StallMonitor::drain() {
  for (;;) {
    if (recv_ == MPI_REQUEST_NULL) {
      if (MPI_Irecv(&inbox_, sizeof(Notice), MPI_BYTE, MPI_ANY_SOURCE, kStallTag, comm_, &recv_) != MPI_SUCCESS) return;
    }
    int flag = 0;
    MPI_Status status;
    if (MPI_Test(&recv_, &flag, &status) != MPI_SUCCESS || !flag) break;
    recv_ = MPI_REQUEST_NULL;
    auto& from = latest_[static_cast<size_t>(status.MPI_SOURCE)];
    if (inbox_.seq >= from.seq) from = inbox_;
    from.what[sizeof from.what - 1] = '\0';
  }
  while (!sent_.empty()) {  // forget delivered notices, oldest first
    auto& s = sent_.front();
    int done = 0;
    if (MPI_Testall(static_cast<int>(s.requests.size()), s.requests.data(), &done, MPI_STATUSES_IGNORE) !=
            MPI_SUCCESS ||
        !done) {
      break;
    }
    sent_.pop_front();
  }
}

void StallMonitor::send(const Notice& notice) {
  Sent s;
  s.notice = std::make_unique<Notice>(notice);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request rq = MPI_REQUEST_NULL;
    if (MPI_Isend(s.notice.get(), sizeof(Notice), MPI_BYTE, r, kStallTag, comm_, &rq) == MPI_SUCCESS) {
      s.requests.push_back(rq);
    }
  }
  sent_.push_back(std::move(s));
}

void StallMonitor::announce(const WaitSite& site) {
  if (announced_ == site.seq && !resolved_) return;
  announced_ = site.seq;
  resolved_ = false;
  Notice n;
  n.seq = site.seq;
  n.waiting = 1;
  const std::string what = site.describe();
  std::strncpy(n.what, what.c_str(), sizeof n.what - 1);
  latest_[static_cast<size_t>(rank_)] = n;
  send(n);
}

void StallMonitor::resolve() {
  resolved_ = true;
  warned_seq_ = 0;  // a next wait in the same collective (a step's next message) warns afresh
  auto& mine = latest_[static_cast<size_t>(rank_)];
  mine.waiting = 0;
  send(mine);
  drain();
}

std::string StallMonitor::behind(const WaitSite& site) {
  announce(site);
  drain();
  std::vector<int> with_me, silent;
  std::map<std::string, std::vector<int>> elsewhere;  // "allreduce #7 (...)" -> ranks waiting in it
  for (int r = 0; r < size_; ++r) {
    const auto& n = latest_[static_cast<size_t>(r)];
    if (n.waiting && n.seq == site.seq) {
      with_me.push_back(r);
    } else if (n.waiting) {
      elsewhere[n.what].push_back(r);
    } else {
      silent.push_back(r);  // nothing heard, or its last wait has ended: not in a collective it reports
    }
  }
  std::string s;
  if (!silent.empty()) {
    s = "stalled: " + rank_list(silent) + " (not waiting in any collective: stopped, hung, dead or busy elsewhere)";
  }
  for (const auto& [what, ranks] : elsewhere) {
    s += (s.empty() ? "" : "; ") + rank_list(ranks) + (ranks.size() == 1 ? " waits" : " wait") + " in " + what;
  }
  if (silent.empty() && elsewhere.empty()) {
    s = "every rank waits in it: the transfer itself is stuck (a node or link may have failed)";
  }
  return s + "; " + rank_list(with_me) + (with_me.size() == 1 ? " waits" : " wait") + " in it";
}

std::string StallMonitor::behind_at_timeout(const WaitSite& site) {
  announce(site);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (;;) {
    drain();
    bool all = true;  // every rank waiting somewhere: nothing more to learn
    for (const auto& n : latest_) all = all && n.waiting;
    if (all || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return behind(site);
}

bool StallMonitor::reports_timeout(const WaitSite& site) {
  announce(site);
  drain();
  for (int r = 0; r < size_; ++r) {
    if (latest_[static_cast<size_t>(r)].waiting) return r == rank_;
  }
  return true;
}

}  // namespace mpiddp::detail
