#include <mpiddp/allocator.hpp>

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace mpiddp {

std::string tune_malloc_for_training(std::size_t mmap_threshold, std::size_t trim_threshold) {
#if defined(__GLIBC__)
  for (const char* chosen : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(chosen) != nullptr) return std::string("malloc: left as set by ") + chosen;
  }
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) == 1;
  return std::string("malloc: mmap threshold ") +
         (mmap_ok ? std::to_string(mmap_threshold >> 20) + " MiB" : "refused") + ", trim threshold " +
         (trim_ok ? std::to_string(trim_threshold >> 20) + " MiB" : "refused");
#else
  (void)mmap_threshold;
  (void)trim_threshold;
  return "malloc: not glibc's, left as it is";
#endif
}

void release_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace mpiddp
