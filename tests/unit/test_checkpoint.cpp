// Snapshot files: exact round trip of every dtype, atomic replacement, the directory's latest.h5
// and keep-K rule, and refusal of truncated, bit-flipped and foreign files.
#include <mpiddp/error.hpp>
#include <mpiddp/snapshot.hpp>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>
#include "error_of.hpp"

#include <filesystem>
#include <fstream>
#include "scoped.hpp"

namespace fs = std::filesystem;
using mpiddp::Snapshot;

using mpiddp::testing::error_of;

namespace {

using mpiddp::testing::TempDir;

Snapshot sample() {
  torch::manual_seed(3);
  Snapshot s;
  s.tensors["model/0.weight"] = torch::randn({4, 3});
  s.tensors["model/0.bias"] = torch::randn({4}, torch::kDouble);
  s.tensors["model/half"] = torch::randn({5}).to(torch::kHalf);
  s.tensors["model/bf16"] = torch::randn({2, 2}).to(torch::kBFloat16);
  s.tensors["optimizer/0.weight/step"] = torch::tensor(int64_t{17});
  s.tensors["optimizer/ints"] = torch::arange(6, torch::kInt).reshape({2, 3});
  s.tensors["rng/rank0"] = torch::randint(0, 255, {64}, torch::kByte);
  s.tensors["empty"] = torch::empty({0, 3});
  s.ints = {{"epoch", 3}, {"global_step", 120}, {"big", int64_t{1} << 40}};
  s.reals = {{"lr", 0.0123456789}, {"loss", -1.5e-300}};
  s.texts = {{"model", "cnn"}, {"config", "{\"a\": [1, 2]}"}, {"multi", "line 1\nline 2"}};
  return s;
}

void expect_same(const Snapshot& a, const Snapshot& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(name)) << name;
    const auto& u = b.tensors.at(name);
    EXPECT_EQ(t.scalar_type(), u.scalar_type()) << name;
    EXPECT_EQ(t.sizes(), u.sizes()) << name;
    EXPECT_TRUE(torch::equal(t, u)) << name;  // bitwise: no tolerance
  }
  EXPECT_EQ(a.ints, b.ints);
  EXPECT_EQ(a.reals, b.reals);
  EXPECT_EQ(a.texts, b.texts);
}

// The file offset of a contiguous dataset's first byte.
haddr_t data_offset(const std::string& path, const char* dataset) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset, H5P_DEFAULT);
  const haddr_t at = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  return at;
}

void flip_byte(const std::string& path, std::streamoff at) {
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(at);
  char c = 0;
  io.get(c);
  io.seekp(at);
  io.put(static_cast<char>(c ^ 0x10));
}

}  // namespace

TEST(Snapshot, RoundTripIsExact) {
  TempDir dir;
  const auto s = sample();
  mpiddp::write_snapshot(dir / "a.h5", s);
  expect_same(s, mpiddp::read_snapshot(dir / "a.h5"));
  expect_same(s, mpiddp::read_snapshot_image(mpiddp::read_file_bytes(dir / "a.h5"), "a.h5"));
  // Nothing else is left beside it.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(Snapshot, FailedWriteLeavesThePreviousFileIntact) {
  TempDir dir;
  auto s = sample();
  mpiddp::write_snapshot(dir / "a.h5", s);
  auto bad = s;
  bad.tensors["model/strange"] = torch::zeros({2}, torch::kBool);  // unsupported dtype: fails mid-write
  const auto why = error_of([&] { mpiddp::write_snapshot(dir / "a.h5", bad); });
  EXPECT_NE(why.find("cannot write snapshot"), std::string::npos) << why;
  expect_same(s, mpiddp::read_snapshot(dir / "a.h5"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);  // no temp file
  const auto nodir = error_of([&] { mpiddp::write_snapshot(dir / "missing/a.h5", s); });
  EXPECT_NE(nodir.find("cannot write snapshot"), std::string::npos) << nodir;
}

TEST(Snapshot, BitFlipInDataIsRefused) {
  TempDir dir;
  mpiddp::write_snapshot(dir / "a.h5", sample());
  flip_byte(dir / "a.h5", static_cast<std::streamoff>(data_offset(dir / "a.h5", "model/0.weight")) + 5);
  const auto why = error_of([&] { mpiddp::read_snapshot(dir / "a.h5"); });
  EXPECT_NE(why.find("is corrupt: the CRC-32 of its bytes does not match the one in its header"), std::string::npos)
      << why;
}

TEST(Snapshot, HeaderNamesSizeAndChecksumAndHdf5ToolsSkipIt) {
  TempDir dir;
  mpiddp::write_snapshot(dir / "a.h5", sample());
  const auto bytes = mpiddp::read_file_bytes(dir / "a.h5");
  const std::string head(bytes.data(), 512);
  EXPECT_EQ(head.rfind("mpiddp-snapshot 2\nbytes " + std::to_string(bytes.size()) + "\ncrc32-after-512 ", 0), 0u)
      << head.c_str();
  // The header is an HDF5 user block: plain HDF5 (h5py, h5dump) opens the file as it is.
  hid_t f = H5Fopen((dir / "a.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t fcpl = H5Fget_create_plist(f);
  hsize_t block = 0;
  H5Pget_userblock(fcpl, &block);
  EXPECT_EQ(block, 512u);
  H5Pclose(fcpl);
  H5Fclose(f);
  // Bytes appended after a complete file, and a damaged header, are refused by name.
  std::ofstream(dir / "a.h5", std::ios::app | std::ios::binary) << "x";
  EXPECT_NE(error_of([&] { mpiddp::read_snapshot(dir / "a.h5"); }).find("has bytes appended"), std::string::npos);
  fs::resize_file(dir / "a.h5", bytes.size());
  flip_byte(dir / "a.h5", 300);  // inside the header's NUL padding
  EXPECT_NE(error_of([&] { mpiddp::read_snapshot(dir / "a.h5"); }).find("its 512-byte header is not one mpiddp writes"),
            std::string::npos);
}

TEST(Snapshot, Format1FilesWrittenBeforeTheHeaderAreStillRead) {
  // tests/data/snapshot-format1.h5: `mpiddp train --model linear` (4 features, 1 epoch of 4 steps)
  // with the writer of format 1 (no header; the inner CRC only).
  const std::string old = std::string(MPIDDP_TEST_DATA_DIR) + "/snapshot-format1.h5";
  const auto s = mpiddp::read_snapshot(old);
  EXPECT_EQ(s.ints.at("global_step"), 4);
  EXPECT_EQ(s.texts.at("model"), "linear");
  EXPECT_EQ(s.tensors.at("model/fc.weight").sizes(), (std::vector<int64_t>{1, 4}));
  auto bytes = mpiddp::read_file_bytes(old);
  bytes[data_offset(old, "model/fc.weight") + 2] ^= 0x01;  // a weight's bit: the inner CRC still catches it
  EXPECT_NE(
      error_of([&] { mpiddp::read_snapshot_image(bytes, "old"); }).find("is corrupt: its checksum does not match"),
      std::string::npos);
}

TEST(Snapshot, TruncatedFileIsRefused) {
  TempDir dir;
  mpiddp::write_snapshot(dir / "a.h5", sample());
  fs::resize_file(dir / "a.h5", fs::file_size(dir / "a.h5") / 2);
  const auto why = error_of([&] { mpiddp::read_snapshot(dir / "a.h5"); });
  EXPECT_NE(why.find("a.h5"), std::string::npos) << why;
  EXPECT_FALSE(why.empty());
}

TEST(Snapshot, ForeignFilesAreRefused) {
  TempDir dir;
  std::ofstream(dir / "text.h5") << "not hdf5 at all\n";
  EXPECT_NE(error_of([&] {
              mpiddp::read_snapshot(dir / "text.h5");
            }).find("is not an mpiddp snapshot (it starts neither with mpiddp's header nor with HDF5's signature)"),
            std::string::npos);
  hid_t f = H5Fcreate((dir / "plain.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Fclose(f);
  EXPECT_NE(error_of([&] { mpiddp::read_snapshot(dir / "plain.h5"); }).find("not an mpiddp snapshot"),
            std::string::npos);
  EXPECT_NE(error_of([&] { mpiddp::read_snapshot(dir / "none.h5"); }).find("does not exist"), std::string::npos);
}

TEST(SnapshotDir, LatestNamesTheNewestAndKeepPrunes) {
  TempDir dir;
  mpiddp::SnapshotDir snaps(dir / "snaps");
  snaps.ensure_writable();
  auto s = sample();
  std::string last;
  for (int64_t step : {5, 10, 15, 20, 25}) {
    s.ints["global_step"] = step;
    last = snaps.save(s, step, 3);
  }
  const auto list = snaps.list();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(fs::path(list[0]).filename(), "snapshot-step0000000025.h5");
  EXPECT_EQ(fs::path(list[2]).filename(), "snapshot-step0000000015.h5");
  EXPECT_EQ(last, list[0]);
  EXPECT_TRUE(fs::is_symlink(dir / "snaps/latest.h5"));
  EXPECT_EQ(fs::read_symlink(dir / "snaps/latest.h5"), "snapshot-step0000000025.h5");
  EXPECT_EQ(mpiddp::read_snapshot(dir / "snaps/latest.h5").ints.at("global_step"), 25);
}

TEST(SnapshotDir, UnwritableDirectoryIsAClearError) {
  TempDir dir;
  std::ofstream(dir / "file") << "x";
  const auto why = error_of([&] { mpiddp::SnapshotDir(dir / "file/sub").ensure_writable(); });
  EXPECT_NE(why.find("snapshot directory '" + (dir / "file/sub") + "' cannot be created"), std::string::npos) << why;
}
