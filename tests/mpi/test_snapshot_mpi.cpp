// One snapshot file written by every rank (format 3, src/snapshot/parallel_snapshot.*), checked
// against independent references: the tensors each rank started from, read back whole by one
// process (read_snapshot, the path `mpiddp export` takes) and in parts by every rank; written
// through MPI-IO and through rank 0 alike; read by fewer ranks than wrote it; the flat-range
// hyperslabs against element-by-element selection; damage (truncation, appended bytes, flipped,
// XORed and zeroed bytes) refused with the same one-line error on every rank or, where HDF5 left
// the damaged bytes unused, read back exactly; a failed write leaves the previous file whole.
#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/snapshot.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "common/check_hdf5.hpp"
#include "mpi_test.hpp"
#include "run_isolated.hpp"
#include "snapshot/parallel_snapshot.hpp"

namespace fs = std::filesystem;
using mpiddp::detail::SnapshotIo;
using mpiddp::detail::SnapshotReader;
using mpiddp::detail::TensorPart;

namespace {

MPI_Comm world() { return mpiddp::testing::runtime().world(); }

// Both ways of reaching the file (the small states here would take rank 0's by the size rule).
#if MPIDDP_HDF5_PARALLEL
const std::vector<SnapshotIo> kIos = {SnapshotIo::kParallel, SnapshotIo::kThroughRankZero};
#else
const std::vector<SnapshotIo> kIos = {SnapshotIo::kThroughRankZero};
#endif
int rank() { return mpiddp::testing::runtime().rank(); }
int size() { return mpiddp::testing::runtime().size(); }

// A directory every rank shares, made by rank 0 and removed at the end.
class SharedDir {
 public:
  SharedDir() {
    std::string path;
    if (rank() == 0) {
      char name[] = "/tmp/mpiddp-snapmpi-XXXXXX";
      path = mkdtemp(name);
    }
    mpiddp::broadcast_string(world(), path);
    path_ = path;
  }
  ~SharedDir() {
    MPI_Barrier(world());
    if (rank() == 0) fs::remove_all(path_);
  }
  std::string operator/(const std::string& f) const { return (fs::path(path_) / f).string(); }

 private:
  std::string path_;
};

// The whole tensors of a trainer-like state (every rank makes the same): awkward sizes no rank
// count divides, a scalar, an empty tensor, 16-bit floats, integers and bytes.
std::map<std::string, torch::Tensor> state() {
  torch::manual_seed(11);
  return {{"model/fc1.weight", torch::randn({33, 7})},
          {"model/fc1.bias", torch::randn({33})},
          {"model/conv.weight", torch::randn({5, 3, 3, 2})},
          {"model/tiny", torch::randn({2})},
          {"model/empty", torch::randn({0, 4})},
          {"optimizer/fc1.weight/exp_avg", torch::randn({33, 7}).to(torch::kBFloat16)},
          {"optimizer/fc1.weight/step", torch::tensor(int64_t{42})},
          {"optimizer/conv.weight/exp_avg_sq", torch::rand({5, 3, 3, 2}).to(torch::kHalf)},
          {"counts", torch::arange(1001, torch::kLong)},
          {"torchscript", torch::randint(0, 255, {4099}, torch::kByte)}};
}

// Rank r's part of each tensor: an even share, or ("uneven") a run of seeded random length so
// some ranks hold none and one holds most, as ZeRO's slices may.
std::vector<TensorPart> parts_of(const std::map<std::string, torch::Tensor>& whole, int r, int n, bool uneven) {
  std::vector<TensorPart> parts;
  for (const auto& [name, t] : whole) {
    if (!uneven) {
      parts.push_back(mpiddp::detail::even_share(name, t, r, n));
      continue;
    }
    std::mt19937 rng(static_cast<uint32_t>(t.numel()));
    std::vector<int64_t> cuts = {0, t.numel()};
    for (int k = 1; k < n; ++k) cuts.push_back(std::uniform_int_distribution<int64_t>(0, t.numel())(rng));
    std::sort(cuts.begin(), cuts.end());
    const int64_t lo = cuts[static_cast<size_t>(r)], hi = cuts[static_cast<size_t>(r) + 1];
    parts.push_back({name, t.scalar_type(), t.sizes().vec(), lo, t.reshape(-1).narrow(0, lo, hi - lo)});
  }
  return parts;
}

mpiddp::Snapshot meta() {
  mpiddp::Snapshot m;
  m.ints = {{"global_step", 42}, {"world_size", size()}};
  m.reals = {{"lr", 3e-4}};
  m.texts = {{"model", "test"}, {"config", "{\"a\": 1}"}};
  return m;
}

bool same(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         (a.numel() == 0 || std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0);
}

// Every tensor, read whole on every rank and in this rank's even share: bitwise the originals.
void expect_reads_back(SnapshotReader& reader, const std::map<std::string, torch::Tensor>& whole) {
  for (const auto& [name, t] : whole) {
    EXPECT_TRUE(same(reader.read_whole(name), t)) << name;
    auto share = mpiddp::detail::even_share(name, t, size() - 1 - rank(), size());  // another rank's share
    auto out = torch::empty({share.part.numel()}, t.scalar_type());
    reader.read(name, share.first, out);
    EXPECT_TRUE(same(out, share.part)) << name << " from element " << share.first;
  }
  reader.verdict();
  EXPECT_EQ(reader.meta().ints.at("global_step"), 42);
  EXPECT_EQ(reader.meta().texts.at("config"), "{\"a\": 1}");
}

std::string error_on_every_rank(const std::function<void()>& f) {
  std::string why;
  try {
    f();
  } catch (const mpiddp::Error& e) {
    why = e.message();
  }
  // The same message on every rank: a rank that did not fail, or failed otherwise, shows here.
  const auto all = mpiddp::allgather_strings(world(), why);
  for (const auto& other : all) EXPECT_EQ(other, why) << "the ranks disagree";
  return why;
}

}  // namespace

TEST(SnapshotFile, FlatRangesSelectExactlyTheirElements) {
  // Every range of every shape, selected as hyperslabs, against the range's own element indices.
  mpiddp::detail::quiet_hdf5();
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{}, {7}, {3, 5}, {2, 3, 4}, {2, 1, 3, 2}}) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    mpiddp::detail::Hid space(
        shape.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
        H5Sclose);
    for (int64_t a = 0; a <= n; ++a) {
      for (int64_t b = a; b <= n; ++b) {
        mpiddp::detail::select_flat_range(space.get(), shape, a, b - a);
        ASSERT_EQ(H5Sget_select_npoints(space.get()), b - a)
            << "shape rank " << shape.size() << " [" << a << "," << b << ")";
        if (shape.empty() || b == a) continue;
        // The selection's bounding box and every element's membership, by its row-major index.
        for (int64_t e = 0; e < n; ++e) {
          std::vector<hsize_t> at(shape.size());
          for (int64_t rest = e, k = static_cast<int64_t>(shape.size()) - 1; k >= 0; --k) {
            at[static_cast<size_t>(k)] = static_cast<hsize_t>(rest % shape[static_cast<size_t>(k)]);
            rest /= shape[static_cast<size_t>(k)];
          }
          const bool inside = H5Sselect_intersect_block(space.get(), at.data(), at.data()) > 0;
          ASSERT_EQ(inside, e >= a && e < b) << "element " << e << " of [" << a << "," << b << ")";
        }
      }
    }
  }
}

TEST(SnapshotFile, EveryRanksPartsReadBackWholeAndInParts) {
  SharedDir dir;
  const auto whole = state();
  for (const bool uneven : {false, true}) {
    for (const auto io : kIos) {
      SCOPED_TRACE(std::string(uneven ? "uneven" : "even") +
                   (io == SnapshotIo::kParallel ? ", MPI-IO" : ", through rank 0"));
      const std::string path = dir / "s.h5";
      mpiddp::detail::write_parallel_snapshot(world(), path, parts_of(whole, rank(), size(), uneven), meta(), io);
      // One process reads it as `mpiddp export` and h5py do: every tensor whole, bitwise.
      if (rank() == 0) {
        const auto s = mpiddp::read_snapshot(path);
        EXPECT_EQ(s.tensors.size(), whole.size());
        for (const auto& [name, t] : whole) EXPECT_TRUE(s.tensors.count(name) && same(s.tensors.at(name), t)) << name;
        EXPECT_EQ(s.ints.at("world_size"), size());
      }
      SnapshotReader reader(world(), path, io);
      expect_reads_back(reader, whole);
      EXPECT_FALSE(fs::exists(dir / ".s.h5.tmp"));
    }
  }
}

TEST(SnapshotFile, FewerRanksReadWhatMoreWrote) {
  SharedDir dir;
  const auto whole = state();
  mpiddp::detail::write_parallel_snapshot(world(), dir / "s.h5", parts_of(whole, rank(), size(), true), meta(),
                                          kIos.front());
  // The first max(1, N-1) ranks read it alone: another world size, every tensor the same.
  MPI_Comm fewer;
  const bool reader_rank = rank() < std::max(1, size() - 1);
  MPI_Comm_split(world(), reader_rank ? 0 : MPI_UNDEFINED, rank(), &fewer);
  if (reader_rank) {
    for (const auto io : kIos) {
      SnapshotReader reader(fewer, dir / "s.h5", io);
      for (const auto& [name, t] : whole) EXPECT_TRUE(same(reader.read_whole(name), t)) << name;
      reader.verdict();
    }
    MPI_Comm_free(&fewer);
  }
}

TEST(SnapshotFile, PartsThatDoNotTileTheTensorAreRefusedEverywhere) {
  SharedDir dir;
  auto parts = parts_of(state(), rank(), size(), false);
  if (rank() == size() - 1) parts[0].part = parts[0].part.narrow(0, 0, parts[0].part.numel() - 1);  // one element short
  const auto why =
      error_on_every_rank([&] { mpiddp::detail::write_parallel_snapshot(world(), dir / "s.h5", parts, meta()); });
  EXPECT_NE(why.find("do not"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(dir / "s.h5"));
  EXPECT_FALSE(fs::exists(dir / ".s.h5.tmp"));
}

TEST(SnapshotFile, AFailedWriteLeavesThePreviousFileWhole) {
  SharedDir dir;
  const auto whole = state();
  const std::string path = dir / "s.h5";
  mpiddp::detail::write_parallel_snapshot(world(), path, parts_of(whole, rank(), size(), false), meta());
  // The rename target is a directory now: everything is written, the last step fails.
  MPI_Barrier(world());
  const std::string blocked = dir / "blocked.h5";
  if (rank() == 0) fs::create_directories(fs::path(blocked) / "inside");
  MPI_Barrier(world());
  const auto why = error_on_every_rank([&] {
    mpiddp::detail::write_parallel_snapshot(world(), blocked, parts_of(whole, rank(), size(), false), meta());
  });
  EXPECT_NE(why.find("cannot write snapshot '" + blocked + "'"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(dir / ".blocked.h5.tmp"));
  SnapshotReader reader(world(), path);
  expect_reads_back(reader, whole);
}

TEST(SnapshotFile, DamageIsTheSameOneLineErrorOnEveryRankOrReadsExactly) {
  SharedDir dir;
  const auto whole = state();
  const std::string good = dir / "good.h5", path = dir / "damaged.h5";
  mpiddp::detail::write_parallel_snapshot(world(), good, parts_of(whole, rank(), size(), true), meta(), kIos.front());
  const auto original = mpiddp::read_file_bytes(good);
  int refused = 0, exact = 0;
  constexpr int kSeeds = 30;
  for (int kind = 0; kind < 5; ++kind) {
    for (uint32_t seed = 0; seed < kSeeds; ++seed) {
      if (rank() == 0) {  // one damaged copy, the same for every rank
        std::mt19937_64 rng(seed * 131u + static_cast<uint32_t>(kind));
        auto bytes = original;
        auto at = [&](size_t span) { return std::uniform_int_distribution<size_t>(0, bytes.size() - span)(rng); };
        if (kind == 0) bytes[at(1)] ^= static_cast<char>(1u << (rng() % 8));
        if (kind == 1)
          for (int i = 0; i < 8; ++i) bytes[at(1)] ^= static_cast<char>(1 + rng() % 255);
        if (kind == 2) std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(at(64)), 64, '\0');
        if (kind == 3) bytes.resize(std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng));
        if (kind == 4) bytes.insert(bytes.end(), 16, 'x');
        std::ofstream(path, std::ios::binary | std::ios::trunc)
            .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      }
      MPI_Barrier(world());
      SCOPED_TRACE("damage " + std::to_string(kind) + " seed " + std::to_string(seed));
      for (const auto io : kIos) {
        const auto why = error_on_every_rank([&] {
          SnapshotReader reader(world(), path, io);
          for (const auto& [name, t] : whole) {
            if (!same(reader.read_whole(name), t)) MPIDDP_THROW("accepted with other contents: " + name);
          }
          reader.verdict();
        });
        if (why.empty()) {
          ++exact;  // HDF5 never reads the bytes it holds free: the file is whole where it matters
          continue;
        }
        ++refused;
        EXPECT_EQ(why.find("accepted with other contents"), std::string::npos) << why;
        EXPECT_EQ(why.find('\n'), std::string::npos) << why;
        EXPECT_NE(why.find("snapshot '" + path + "'"), std::string::npos) << why;
      }
    }
  }
  if (rank() == 0) std::cout << "damaged format-3 snapshots: " << refused << " refused, " << exact << " read exactly\n";
  EXPECT_GE(refused,
            4 * kSeeds * static_cast<int>(kIos.size()));  // truncation and appended bytes always; most of the rest
}

TEST(SnapshotFile, OneReaderOfADamagedFileNeverCrashesOrHangs) {
  // What `mpiddp export`, `generate` and h5py-like tools meet: one process reading a damaged
  // format-3 file, each case in a forked child (rank 0's; the others wait) so that a crash or a
  // hang inside HDF5 is counted by seed instead of ending the test.
  SharedDir dir;
  const auto whole = state();
  const std::string good = dir / "good.h5", path = dir / "damaged.h5";
  mpiddp::detail::write_parallel_snapshot(world(), good, parts_of(whole, rank(), size(), true), meta());
  if (rank() == 0) {
    const auto original = mpiddp::read_file_bytes(good);
    int counts[5] = {};
    std::vector<std::string> problems;
    for (int kind = 0; kind < 4; ++kind) {
      for (uint32_t seed = 0; seed < 60; ++seed) {
        std::mt19937_64 rng(seed * 977u + static_cast<uint32_t>(kind));
        auto bytes = original;
        auto at = [&](size_t span) { return std::uniform_int_distribution<size_t>(0, bytes.size() - span)(rng); };
        if (kind == 0) bytes[at(1)] ^= static_cast<char>(1u << (rng() % 8));
        if (kind == 1)
          for (int i = 0; i < 8; ++i) bytes[at(1)] ^= static_cast<char>(1 + rng() % 255);
        if (kind == 2) std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(at(64)), 64, '\0');
        if (kind == 3) bytes.resize(std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng));
        std::ofstream(path, std::ios::binary | std::ios::trunc)
            .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        const auto o = mpiddp::testing::run_isolated([&] {
          const auto s = mpiddp::read_snapshot(path);
          for (const auto& [name, t] : whole) {
            if (!s.tensors.count(name) || !same(s.tensors.at(name), t))
              throw std::runtime_error("other contents: " + name);
          }
        });
        ++counts[o.what];
        const std::string where = "damage " + std::to_string(kind) + " seed " + std::to_string(seed) + ": ";
        if (o.what == mpiddp::testing::Outcome::kCleanError &&
            (o.detail.rfind("snapshot '" + path + "' ", 0) != 0 || o.detail.find('\n') != std::string::npos)) {
          problems.push_back(where + "message: " + o.detail);
        } else if (o.what != mpiddp::testing::Outcome::kCleanError && o.what != mpiddp::testing::Outcome::kAccepted) {
          problems.push_back(where + o.detail);
        }
      }
    }
    std::cout << "one reader, damaged format-3 snapshots: " << counts[mpiddp::testing::Outcome::kCleanError]
              << " refused, " << counts[mpiddp::testing::Outcome::kAccepted] << " read exactly, "
              << counts[mpiddp::testing::Outcome::kCrashed] << " crashes, " << counts[mpiddp::testing::Outcome::kHung]
              << " hangs\n";
    for (const auto& p : problems) ADD_FAILURE() << p;
  }
  MPI_Barrier(world());
}
