// HDF5 datasets (round trips, row selection, bad files) and the distributed sampler's rules.
#include <mpiddp/data.hpp>
#include <mpiddp/error.hpp>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>
#include <zlib.h>
#include "error_of.hpp"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <set>
#include <thread>

using mpiddp::DistributedSampler;
using mpiddp::H5Dataset;

using mpiddp::testing::error_of;

namespace {

std::string tmp(const std::string& name) { return ::testing::TempDir() + "mpiddp_test_" + name; }

// A file with /inputs of `n_in` rows and /targets of `n_tg` rows, written with HDF5 directly
// (write_dataset refuses such files).
void write_raw(const std::string& path, hsize_t n_in, hsize_t n_tg, bool with_targets = true) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t din[2] = {n_in, 3};
  hid_t s = H5Screate_simple(2, din, nullptr);
  hid_t d = H5Dcreate2(f, "inputs", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(d);
  H5Sclose(s);
  if (with_targets) {
    hsize_t dtg[1] = {n_tg};
    s = H5Screate_simple(1, dtg, nullptr);
    d = H5Dcreate2(f, "targets", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(d);
    H5Sclose(s);
    int64_t classes = 3;
    s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "num_classes", H5T_NATIVE_INT64, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &classes);
    H5Aclose(a);
    H5Sclose(s);
  }
  H5Fclose(f);
}

}  // namespace

TEST(Dataset, FloatRoundTripAnyIndexOrder) {
  torch::manual_seed(1);
  auto x = torch::randn({50, 4, 3});
  auto y = torch::randint(0, 7, {50}, torch::kLong);
  const auto path = tmp("float.h5");
  mpiddp::write_dataset(path, x, y, 1.0, 7, "test");
  H5Dataset d(path);
  EXPECT_EQ(d.size(), 50);
  EXPECT_EQ(d.info().sample_shape, (std::vector<int64_t>{4, 3}));
  EXPECT_TRUE(d.info().classification);
  EXPECT_EQ(d.info().num_classes, 7);
  std::vector<int64_t> idx = {49, 3, 4, 5, 3, 0, 17, 48};  // unsorted, a run, a repeat, both ends
  auto e = d.read(idx);
  auto want = torch::tensor(idx, torch::kLong);
  EXPECT_TRUE(torch::equal(e.inputs, x.index_select(0, want)));
  EXPECT_TRUE(torch::equal(e.targets, y.index_select(0, want)));
  auto r = d.read_range(10, 25);
  EXPECT_TRUE(torch::equal(r.inputs, x.narrow(0, 10, 25)));
  EXPECT_NO_THROW(d.check_labels(7));
  EXPECT_NE(error_of([&] { d.check_labels(5); }).find("labels range over [0, 6] but the model has 5 classes"),
            std::string::npos);
  EXPECT_FALSE(error_of([&] { d.read({50}); }).empty());
}

TEST(Dataset, Uint8InputsScaledRegressionTargets) {
  auto x = torch::arange(0, 240, torch::kLong).remainder(256).to(torch::kUInt8).reshape({20, 12});
  auto y = torch::rand({20, 2});
  const auto path = tmp("bytes.h5");
  mpiddp::write_dataset(path, x, y, 1.0 / 255.0);
  H5Dataset d(path);
  EXPECT_TRUE(d.info().uint8_inputs);
  EXPECT_FALSE(d.info().classification);
  EXPECT_EQ(d.info().target_dim, 2);
  auto e = d.read({19, 0});
  EXPECT_TRUE(torch::allclose(e.inputs, x.index_select(0, torch::tensor({19, 0})).to(torch::kFloat) / 255.0f));
  EXPECT_TRUE(torch::equal(e.targets, y.index_select(0, torch::tensor({19, 0}))));
}

TEST(Dataset, BadFilesAreOneLineErrors) {
  EXPECT_EQ(error_of([] { H5Dataset d("/nonexistent/x.h5"); }), "dataset file '/nonexistent/x.h5' does not exist");
  const auto text = tmp("text.h5");
  std::ofstream(text) << "not hdf5";
  EXPECT_NE(error_of([&] { H5Dataset d(text); }).find("is not a readable HDF5 file"), std::string::npos);
  const auto no_targets = tmp("no_targets.h5");
  write_raw(no_targets, 5, 5, false);
  EXPECT_NE(error_of([&] { H5Dataset d(no_targets); }).find("has no dataset /targets"), std::string::npos);
  const auto mismatch = tmp("mismatch.h5");
  write_raw(mismatch, 5, 4);
  EXPECT_NE(error_of([&] { H5Dataset d(mismatch); }).find("/inputs has 5 samples but /targets has 4"),
            std::string::npos);
  const auto empty = tmp("empty.h5");
  write_raw(empty, 0, 0);
  EXPECT_NE(error_of([&] { H5Dataset d(empty); }).find("empty dataset"), std::string::npos);
}

TEST(Sampler, PaddedShardsFollowPyTorchsRule) {
  // 10 samples over 4 ranks without shuffle: ceil(10/4) = 3 each; positions 10, 11 repeat 0, 1.
  const std::vector<std::vector<int64_t>> want = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(10, r, 4, /*shuffle=*/false);
    EXPECT_EQ(s.num_samples(), 3);
    EXPECT_EQ(s.indices(), want[static_cast<size_t>(r)]);
  }
}

TEST(Sampler, DropLastGivesDisjointEqualShards) {
  std::set<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s(11, r, 3, true, 5, /*drop_last=*/true);
    EXPECT_EQ(s.num_samples(), 3);
    for (auto i : s.indices()) EXPECT_TRUE(seen.insert(i).second) << "index " << i << " twice";
  }
  EXPECT_EQ(seen.size(), 9u);
  EXPECT_FALSE(error_of([] { DistributedSampler s(2, 0, 3, true, 0, true); }).empty());
}

TEST(Sampler, ShuffleCoversEverySampleAndDependsOnEpochOnly) {
  const int world = 3;
  const int64_t n = 100;
  auto all_ranks = [&](int64_t epoch, uint64_t seed) {
    std::vector<std::vector<int64_t>> out;
    for (int r = 0; r < world; ++r) {
      DistributedSampler s(n, r, world, true, seed);
      s.set_epoch(epoch);
      out.push_back(s.indices());
    }
    return out;
  };
  auto e0 = all_ranks(0, 42);
  std::multiset<int64_t> seen;
  for (const auto& v : e0) {
    EXPECT_EQ(v.size(), 34u);
    seen.insert(v.begin(), v.end());
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u);
  EXPECT_EQ(seen.size(), 102u);                   // two padded repeats
  EXPECT_EQ(all_ranks(0, 42), e0);                // deterministic: every rank computes the same order
  EXPECT_NE(all_ranks(1, 42), e0);                // set_epoch reshuffles
  EXPECT_EQ(all_ranks(1, 41), all_ranks(0, 42));  // the generator is seeded with seed + epoch
  // The global order is torch.randperm(n) from a generator seeded with seed + epoch, as PyTorch.
  auto perm = torch::randperm(n, at::detail::createCPUGenerator(42), torch::kLong);
  EXPECT_EQ(e0[1][0], perm[1].item<int64_t>());
  EXPECT_EQ(e0[2][5], perm[2 + 5 * world].item<int64_t>());
}

TEST(Idx, ReadsGzipAndRejectsGarbage) {
  const auto path = tmp("small.idx.gz");
  {
    gzFile f = gzopen(path.c_str(), "wb");
    const unsigned char head[] = {0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3};
    const unsigned char data[] = {1, 2, 3, 4, 5, 250};
    gzwrite(f, head, sizeof head);
    gzwrite(f, data, sizeof data);
    gzclose(f);
  }
  auto t = mpiddp::read_idx(path);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t[1][2].item<int>(), 250);
  const auto bad = tmp("bad.idx");
  std::ofstream(bad) << "hello world!";
  EXPECT_NE(error_of([&] { mpiddp::read_idx(bad); }).find("not an IDX file"), std::string::npos);
  const auto cut = tmp("cut.idx");
  std::ofstream(cut, std::ios::binary).write("\0\0\x08\x01\0\0\0\x09\x01", 9);
  EXPECT_NE(error_of([&] { mpiddp::read_idx(cut); }).find("truncated"), std::string::npos);
}

// ---- BatchPrefetcher ----------------------------------------------------------------------------

namespace {

mpiddp::Example numbered(int64_t i) { return {torch::full({2}, static_cast<float>(i)), torch::tensor({i})}; }

}  // namespace

TEST(Prefetcher, ReturnsEveryBatchInOrderAndStaysWithinItsDepth) {
  for (int depth : {0, 1, 2, 5}) {
    std::atomic<int64_t> consumed{0}, worst_lead{-100};
    std::atomic<bool> other_thread{false};
    const auto caller = std::this_thread::get_id();
    {
      mpiddp::BatchPrefetcher batches(
          [&](int64_t i) {
            int64_t lead = i - consumed.load();  // batches read ahead of the consumer
            for (int64_t w = worst_lead.load(); lead > w && !worst_lead.compare_exchange_weak(w, lead);) {
            }
            if (std::this_thread::get_id() != caller) other_thread = true;
            return numbered(i);
          },
          40, depth);
      for (int64_t i = 0; i < 40; ++i) {
        auto e = batches.next();
        ASSERT_EQ(e.targets.item<int64_t>(), i) << "depth " << depth;
        ASSERT_EQ(e.inputs[1].item<float>(), static_cast<float>(i));
        ++consumed;
      }
      EXPECT_EQ(batches.taken(), 40);
      EXPECT_NE(error_of([&] { batches.next(); }).find("all 40 batches were taken"), std::string::npos);
    }
    EXPECT_LE(worst_lead.load(), depth) << "the reader ran further ahead than its depth";
    EXPECT_EQ(other_thread.load(), depth > 0) << "depth 0 reads on the caller's thread, else on the reader's";
  }
}

TEST(Prefetcher, AFailedReadSurfacesAtItsBatchAfterTheOnesBefore) {
  for (int depth : {0, 3}) {
    std::atomic<int> reads_after{0};
    mpiddp::BatchPrefetcher batches(
        [&](int64_t i) {
          if (i > 5) ++reads_after;
          if (i == 5) MPIDDP_THROW("batch five is damaged");
          return numbered(i);
        },
        20, depth);
    for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(batches.next().targets.item<int64_t>(), i);
    EXPECT_NE(error_of([&] { batches.next(); }).find("batch five is damaged"), std::string::npos);
    EXPECT_NE(error_of([&] { batches.next(); }).find("batch five is damaged"), std::string::npos) << "and stays failed";
    EXPECT_EQ(reads_after.load(), 0) << "nothing is read past a failure";
  }
}

TEST(Prefetcher, StopsCleanlyWithBatchesLeftAndBlocksAsyncSignals) {
  std::atomic<int> reads{0};
  std::atomic<bool> term_blocked{false}, usr1_blocked{false}, segv_blocked{true};
  {
    mpiddp::BatchPrefetcher batches(
        [&](int64_t i) {
          sigset_t now;
          pthread_sigmask(SIG_BLOCK, nullptr, &now);
          term_blocked = sigismember(&now, SIGTERM) == 1;
          usr1_blocked = sigismember(&now, SIGUSR1) == 1;
          segv_blocked = sigismember(&now, SIGSEGV) == 1;
          ++reads;
          return numbered(i);
        },
        1000000, 2);
    batches.next();
    // The destructor must end a reader that waits for room in a full queue.
  }
  EXPECT_LE(reads.load(), 4);
  EXPECT_TRUE(term_blocked.load());
  EXPECT_TRUE(usr1_blocked.load());
  EXPECT_FALSE(segv_blocked.load()) << "faults of the reader's own code stay deliverable";
  // The caller's signal mask is its own.
  sigset_t mine;
  pthread_sigmask(SIG_BLOCK, nullptr, &mine);
  EXPECT_EQ(sigismember(&mine, SIGTERM), 0);
}

TEST(Prefetcher, PauseHoldsTheReaderBetweenReads) {
  std::atomic<int> reads{0};  // counted as each read starts
  mpiddp::BatchPrefetcher batches(
      [&](int64_t i) {
        ++reads;
        return numbered(i);
      },
      100, 3);
  batches.next();
  while (reads.load() < 4) std::this_thread::yield();  // batches 1..3 queued (or the last in progress)
  {
    auto hold = batches.pause();  // waits for a read in progress
    for (int64_t i = 1; i <= 3; ++i) EXPECT_EQ(batches.next().targets.item<int64_t>(), i);
    // The queue has room now: an unpaused reader would read batches 4..6.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(reads.load(), 4) << "a paused reader read";
  }
  for (int64_t i = 4; i < 14; ++i) EXPECT_EQ(batches.next().targets.item<int64_t>(), i);  // and reads again
}

TEST(Prefetcher, RejectsBadArguments) {
  EXPECT_NE(error_of([] { mpiddp::BatchPrefetcher(nullptr, 1, 1); }).find("needs a read function"), std::string::npos);
  EXPECT_NE(error_of([] { mpiddp::BatchPrefetcher(numbered, 1, -1); }).find("must be >= 0"), std::string::npos);
}
