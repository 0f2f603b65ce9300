// The memory plan's text and this process's memory figures (include/mpiddp/memory_plan.hpp).
#include <mpiddp/memory_plan.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <malloc.h>

namespace mpiddp {

namespace {

int64_t status_kib(const std::string& field) {  // "VmRSS:   123 kB" -> 123
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return 0;
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f", static_cast<double>(bytes) / (1 << 20));
  return text;
}

}  // namespace

int64_t resident_bytes() { return status_kib("VmRSS") * 1024; }
int64_t peak_resident_bytes() { return status_kib("VmHWM") * 1024; }

bool reset_peak_resident_bytes() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

int64_t heap_bytes_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
#else
  return 0;
#endif
}

std::string MemoryPlan::describe() const {
  std::ostringstream out;
  out << "memory plan per rank: peak " << mib(peak()) << " MiB = process " << mib(process) << " + parameters "
      << mib(parameters) << " + gradients " << mib(gradients) << " + optimizer state " << mib(optimizer_state)
      << " + activations " << mib(activations) << " + snapshot buffers " << mib(snapshot_buffers);
  return out.str();
}

std::string MemoryPlan::against(const std::vector<int64_t>& rank_peaks, int64_t steps) const {
  const auto top = std::max_element(rank_peaks.begin(), rank_peaks.end());
  const auto least = std::min_element(rank_peaks.begin(), rank_peaks.end());
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2f", static_cast<double>(*top) / static_cast<double>(std::max<int64_t>(1, peak())));
  std::ostringstream out;
  out << "memory: measured peak " << mib(*top) << " MiB per rank (rank " << top - rank_peaks.begin();
  if (rank_peaks.size() > 1) out << "; the least " << mib(*least) << ", rank " << least - rank_peaks.begin();
  out << ") after " << steps << (steps == 1 ? " step" : " steps") << ", " << ratio << " x the plan's " << mib(peak())
      << " MiB";
  return out.str();
}

}  // namespace mpiddp
