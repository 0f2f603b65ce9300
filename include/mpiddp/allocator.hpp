// Process-wide memory allocator settings for training. Opt-in: the library never calls this by
// itself; the `mpiddp` executable does at start-up, and a program using the library may.
#pragma once

#include <cstddef>
#include <string>

namespace mpiddp {

/// Default thresholds of tune_malloc_for_training().
inline constexpr std::size_t kMallocMmapThresholdBytes = std::size_t{32} << 20;  ///< glibc's largest
inline constexpr std::size_t kMallocTrimThresholdBytes = std::size_t{512} << 20;
/// The mmap threshold for a run that trades speed for memory (activation checkpointing: `mpiddp
/// train` sets it then). Recomputing a block's activations in backward frees and allocates buffers
/// of many sizes between the gradients, which a heap serving everything up to 32 MiB keeps resident
/// beside the next ones: 27% above the memory plan at GPT-2's width and 1024-token context at stage
/// 3, 4% with this (docs/performance.md#zero-memory). Above 4 MiB each buffer is mapped and handed
/// back at once, at the cost of page faults (0.92x a small model's tokens/s, median).
inline constexpr std::size_t kMallocLeanMmapThresholdBytes = std::size_t{4} << 20;

/// Makes glibc's malloc keep memory freed between training steps for the next step instead of
/// handing it back to the kernel. A CPU training step allocates and frees the same activation and
/// gradient buffers (MBs each) every step; by default glibc serves each from a fresh mmap (above
/// its 128 KiB-to-32 MiB sliding threshold) or trims the heap after it, so every step pays page
/// faults and the kernel's zeroing of every page again (10% of a CNN step's time in the kernel,
/// measured with perf on libtorch 2.14). This sets M_MMAP_THRESHOLD (allocations below it come from
/// the heap) and M_TRIM_THRESHOLD (free memory kept at the heap's top) with mallopt.
/// Leaves everything as it is, and says so, where the user chose already (MALLOC_MMAP_THRESHOLD_,
/// MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES set) or where malloc is not glibc's.
/// Returns one line saying what it did.
std::string tune_malloc_for_training(std::size_t mmap_threshold = kMallocMmapThresholdBytes,
                                     std::size_t trim_threshold = kMallocTrimThresholdBytes);

/// Hands the heap's free pages back to the kernel (glibc's malloc_trim(0): free chunks anywhere in
/// any arena, not only at the top); nothing where malloc is not glibc's. For after a large part of
/// the memory is freed once for good (ZeRO stage 3 sharding the model it was built with): with the
/// thresholds above, those tensors came from the heap and would stay resident.
void release_free_memory();

}  // namespace mpiddp
