// This process's memory figures (include/mpiddp/memory.hpp).
#include <mpiddp/memory.hpp>

#include <fstream>
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

}  // namespace mpiddp
