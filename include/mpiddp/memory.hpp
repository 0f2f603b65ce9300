// This process's memory figures: its resident size, the high-water mark, malloc's bytes in use
// (the memory plan's measurements, memory_plan.hpp; tests and benchmarks read them too).
#pragma once

#include <cstdint>

namespace mpiddp {

/// This process's resident memory now and its high-water mark (Linux: /proc/self/status VmRSS,
/// VmHWM; 0 where unknown).
int64_t resident_bytes();
int64_t peak_resident_bytes();
/// Sets the high-water mark back to the resident size now (Linux: /proc/self/clear_refs 5; also
/// what getrusage's ru_maxrss reports from then on); false where it cannot.
bool reset_peak_resident_bytes();
/// Bytes malloc has handed out and not yet had back (glibc's mallinfo2; 0 where unknown).
int64_t heap_bytes_in_use();

}  // namespace mpiddp
