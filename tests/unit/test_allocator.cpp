// tune_malloc_for_training(): a user's own choice wins; once tuned, a step's buffers come from the
// heap and stay there after being freed, or under the lean threshold are mapped and handed back
// (glibc's own statistics, mallinfo2, are the reference).
#include <gtest/gtest.h>
#include <mpiddp/allocator.hpp>

#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

TEST(Allocator, TunesGlibcUnlessTheUserChose) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces malloc: glibc's settings and statistics do not apply";
#elif defined(__GLIBC__)
  setenv("MALLOC_TRIM_THRESHOLD_", "1000000", 1);
  EXPECT_EQ(mpiddp::tune_malloc_for_training(), "malloc: left as set by MALLOC_TRIM_THRESHOLD_");
  unsetenv("MALLOC_TRIM_THRESHOLD_");

  EXPECT_EQ(mpiddp::tune_malloc_for_training(), "malloc: mmap threshold 32 MiB, trim threshold 512 MiB");
  // A step's worth of 9 MiB buffers (the CNN's largest activation at batch 64): served from the
  // heap, not mapped one by one, and still held by the heap once freed, ready for the next step.
  // glibc's own statistics are the reference; its defaults would map each block or trim the heap
  // back (its trim threshold never exceeds 64 MiB by itself).
  const std::size_t block = std::size_t{9} << 20;
  const auto mapped_before = mallinfo2().hblks;
  std::vector<void*> blocks;
  for (int i = 0; i < 12; ++i) {
    blocks.push_back(std::malloc(block));
    std::memset(blocks.back(), 1, block);
  }
  EXPECT_EQ(mallinfo2().hblks, mapped_before) << "step buffers were mapped one by one";
  for (void* p : blocks) std::free(p);
  blocks.clear();
  EXPECT_GE(mallinfo2().arena, 12 * block) << "the heap was trimmed back after the step";
  EXPECT_GE(mallinfo2().fordblks, 12 * block) << "freed step buffers are not kept for reuse";

  // The lean threshold (activation checkpointing): once the heap's free memory is used up, the
  // same buffers are mapped one by one (not the heap grown) and handed back as they are freed.
  EXPECT_EQ(mpiddp::tune_malloc_for_training(mpiddp::kMallocLeanMmapThresholdBytes),
            "malloc: mmap threshold 4 MiB, trim threshold 512 MiB");
  const auto mapped_lean = mallinfo2().hblks;
  const std::size_t free_in_heap = mallinfo2().fordblks;
  for (std::size_t taken = 0; taken <= free_in_heap + block; taken += block) blocks.push_back(std::malloc(block));
  EXPECT_GT(mallinfo2().hblks, mapped_lean) << "9 MiB buffers beyond the heap's free memory grew the heap";
  for (void* p : blocks) std::free(p);
  EXPECT_EQ(mallinfo2().hblks, mapped_lean) << "freed 9 MiB buffers stayed mapped";
  mpiddp::tune_malloc_for_training();  // back to the training thresholds
#else
  EXPECT_EQ(mpiddp::tune_malloc_for_training(), "malloc: not glibc's, left as it is");
#endif
}
