// Writes the malformed dataset files tests/system/train_cli.sh feeds to `mpiddp train`.
// usage: make_bad_datasets DIR
#include <mpiddp/data.hpp>

#include <hdf5.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

namespace {

// /inputs float32 [n_in, 20] and, optionally, /targets float32 [n_tg, 1], written raw.
void raw(const std::string& path, hsize_t n_in, hsize_t n_tg, bool targets) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t din[2] = {n_in, 20}, dtg[2] = {n_tg, 1};
  hid_t s = H5Screate_simple(2, din, nullptr);
  H5Dclose(H5Dcreate2(f, "inputs", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5Sclose(s);
  if (targets) {
    s = H5Screate_simple(2, dtg, nullptr);
    H5Dclose(H5Dcreate2(f, "targets", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Sclose(s);
  }
  H5Fclose(f);
}

// A regression set of 64 rows whose /inputs is stored one deflated row per chunk, with the bytes
// of row 41's chunk scrambled: it opens and passes every check, and only reading row 41 fails.
// Without shuffling that row is in step 10 at 1 rank x batch 4, and at 2 ranks x batch 4 in
// global step 5 (rows 40..47) on rank 1 (odd rows).
void damaged_row(const std::string& path) {
  auto x = torch::rand({64, 20});
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t din[2] = {64, 20}, dtg[2] = {64, 1}, chunk[2] = {1, 20};
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 2, chunk);
  H5Pset_deflate(dcpl, 1);
  hid_t s = H5Screate_simple(2, din, nullptr);
  hid_t d = H5Dcreate2(f, "inputs", H5T_IEEE_F32LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data_ptr());
  H5Sclose(s);
  H5Pclose(dcpl);
  s = H5Screate_simple(2, dtg, nullptr);
  hid_t t = H5Dcreate2(f, "targets", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  auto y = torch::rand({64, 1});
  H5Dwrite(t, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data_ptr());
  H5Dclose(t);
  H5Sclose(s);
  H5Dflush(d);
  hsize_t at[2] = {41, 0}, size = 0;
  haddr_t addr = 0;
  unsigned mask = 0;
  H5Dget_chunk_info_by_coord(d, at, &mask, &addr, &size);
  H5Dclose(d);
  H5Fclose(f);
  std::FILE* file = std::fopen(path.c_str(), "r+b");
  std::vector<unsigned char> bytes(size);
  std::fseek(file, static_cast<long>(addr), SEEK_SET);
  if (std::fread(bytes.data(), 1, size, file) != size) std::abort();
  for (auto& b : bytes) b ^= 0x5A;
  std::fseek(file, static_cast<long>(addr), SEEK_SET);
  std::fwrite(bytes.data(), 1, size, file);
  std::fclose(file);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  raw(dir + "/no_targets.h5", 8, 8, false);
  raw(dir + "/mismatch.h5", 8, 7, true);
  raw(dir + "/empty.h5", 0, 0, true);
  // Labels 0..9 in a file that declares 5 classes.
  mpiddp::write_dataset(dir + "/labels.h5", torch::rand({40, 20}), torch::arange(40, torch::kLong).remainder(10), 1.0,
                        5);
  mpiddp::write_dataset(dir + "/three.h5", torch::rand({3, 20}), torch::rand({3, 1}));
  // A regression set whose row 21 holds a NaN: without shuffling, at 2 ranks x batch 4 it is in
  // global step 2 (rows 16..23), on rank 1 (odd rows).
  auto x = torch::rand({64, 20});
  x[21][3] = std::numeric_limits<float>::quiet_NaN();
  mpiddp::write_dataset(dir + "/nan.h5", x, torch::rand({64, 1}));
  damaged_row(dir + "/damaged_row.h5");
  // The first 384 Fashion-MNIST training images, when Debian's dataset-fashion-mnist is there: a
  // CNN workload small enough to cross several epochs in seconds.
  const std::string fm = "/usr/share/datasets/fashion-mnist/";
  if (std::filesystem::exists(fm + "train-images-idx3-ubyte.gz")) {
    auto images = mpiddp::read_idx(fm + "train-images-idx3-ubyte.gz").slice(0, 0, 384).unsqueeze(1).contiguous();
    auto labels = mpiddp::read_idx(fm + "train-labels-idx1-ubyte.gz").slice(0, 0, 384).to(torch::kLong);
    mpiddp::write_dataset(dir + "/fm-small.h5", images, labels, 1.0 / 255.0, 10, "fashion-mnist (first 384)");
  }
  return 0;
}
