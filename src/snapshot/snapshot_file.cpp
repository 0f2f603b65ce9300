#include <mpiddp/error.hpp>
#include <mpiddp/snapshot.hpp>

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <regex>
#include <sstream>

#include "common/check_hdf5.hpp"
#include "snapshot/snapshot_format.hpp"

namespace mpiddp {
namespace {

namespace fs = std::filesystem;
using detail::Hid;
using namespace detail;  // the format's shared pieces: snapshot_format.hpp

// Verifies a format-2 image's header against its bytes; throws naming what is wrong.
void verify_image(const std::vector<char>& image, const std::string& name, Header& header) {
  auto fail = [&](const std::string& why) { MPIDDP_THROW("snapshot '" + name + "' " + why); };
  if (image.size() < kUserBlock) {
    fail("is truncated: " + std::to_string(image.size()) + " bytes, less than its " + std::to_string(kUserBlock) +
         "-byte header");
  }
  if (!parse_user_block(std::string(image.data(), kUserBlock), header)) {
    fail("is damaged: its 512-byte header is not one mpiddp writes");
  }
  if (header.bytes != image.size()) {
    fail(std::string(image.size() < header.bytes ? "is truncated" : "has bytes appended") + ": " +
         std::to_string(image.size()) + " bytes where its header says " + std::to_string(header.bytes));
  }
  if (header.version == kWholeFileFormat &&
      crc_of(image.data() + kUserBlock, image.size() - kUserBlock) != header.crc) {
    fail("is corrupt: the CRC-32 of its bytes does not match the one in its header (damaged on disk or in transit)");
  }
}

// Format 2's CRC-32 over everything a snapshot holds, in the maps' (sorted) order.
uint32_t checksum(const Snapshot& s) {
  uint32_t crc = crc_of(nullptr, 0);
  auto add = [&](const void* data, size_t n) { crc = crc_update(crc, data, n); };
  auto add_text = [&](const std::string& t) { add(t.c_str(), t.size() + 1); };
  for (const auto& [name, t] : s.tensors) {
    add_text(name);
    add_text(dtype_of(t.scalar_type()).name);
    for (auto d : t.sizes()) add(&d, sizeof d);
    auto c = t.contiguous();
    add(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  return attributes_checksum(crc, s);
}

// HDF5 builds the file in memory (core driver, no backing store); the caller writes the bytes
// itself, so a full disk or an I/O error is one errno and never leaves an HDF5 file half open.
std::vector<char> file_image(const Snapshot& s) {
  Hid fapl(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  MPIDDP_CHECK_HDF5(H5Pset_fapl_core(fapl.get(), 1 << 20, 0));
  Hid f(MPIDDP_CHECK_HDF5(H5Fcreate("/dev/null/mpiddp-new-snapshot", H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get())),
        H5Fclose);
  Hid lcpl(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
  MPIDDP_CHECK_HDF5(H5Pset_create_intermediate_group(lcpl.get(), 1));
  for (const auto& [name, tensor] : s.tensors) {
    const auto& dt = dtype_of(tensor.scalar_type());
    auto c = tensor.detach().cpu().contiguous();
    std::vector<hsize_t> dims(c.sizes().begin(), c.sizes().end());
    Hid space(MPIDDP_CHECK_HDF5(dims.empty() ? H5Screate(H5S_SCALAR)
                                             : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
              H5Sclose);
    Hid d(MPIDDP_CHECK_HDF5(
              H5Dcreate2(f.get(), name.c_str(), dt.file_type, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT)),
          H5Dclose);
    if (c.numel() > 0) MPIDDP_CHECK_HDF5(H5Dwrite(d.get(), dt.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, c.data_ptr()));
    write_text_attr(d.get(), kDtypeAttr, dt.name);
  }
  write_text_attr(f.get(), "format", kSnapshotFormat);
  detail::write_scalar_attr(f.get(), "format_version", H5T_NATIVE_INT64, &kWholeFileFormat);
  for (const auto& [name, v] : s.ints) detail::write_scalar_attr(f.get(), name, H5T_NATIVE_INT64, &v);
  for (const auto& [name, v] : s.reals) detail::write_scalar_attr(f.get(), name, H5T_NATIVE_DOUBLE, &v);
  for (const auto& [name, v] : s.texts) write_text_attr(f.get(), name, v);
  const int64_t crc = checksum(s);
  detail::write_scalar_attr(f.get(), kChecksumAttr, H5T_NATIVE_INT64, &crc);
  MPIDDP_CHECK_HDF5(H5Fflush(f.get(), H5F_SCOPE_GLOBAL));
  // The header goes in front of HDF5's image: HDF5 finds its superblock at 512 and takes the
  // bytes before it as a user block, as for a file made by h5jam.
  const ssize_t size = MPIDDP_CHECK_HDF5(H5Fget_file_image(f.get(), nullptr, 0));
  std::vector<char> image(kUserBlock + static_cast<size_t>(size));
  MPIDDP_CHECK_HDF5(H5Fget_file_image(f.get(), image.data() + kUserBlock, static_cast<size_t>(size)));
  const auto block =
      user_block(kWholeFileFormat, image.size(), crc_of(image.data() + kUserBlock, image.size() - kUserBlock));
  std::copy(block.begin(), block.end(), image.begin());
  return image;
}

// Writes all of `bytes` to a new file `path` and fsyncs it; throws with errno's text.
void write_synced(const std::string& path, const std::vector<char>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MPIDDP_CHECK(fd >= 0, std::string(std::strerror(errno)));
  size_t done = 0;
  int err = 0;
  while (done < bytes.size() && err == 0) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno != EINTR) err = errno;
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  MPIDDP_CHECK(err == 0, std::string(std::strerror(err)));
}

// Makes a rename in `path` durable.
void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MPIDDP_CHECK(fd >= 0, "cannot open '" + path + "' to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  MPIDDP_CHECK(rc == 0, "fsync of '" + path + "' failed: " + std::strerror(err));
}

// Reads every object of an open snapshot file into a Snapshot and verifies it: format 3 each
// dataset's CRC-32 and the manifest, formats 1 and 2 the checksum over everything.
Snapshot read_open(hid_t f, const std::string& name) {
  auto fail = [&](const std::string& why) { MPIDDP_THROW("snapshot '" + name + "' " + why); };
  Catalog c = read_catalog(f, name);
  Snapshot s = std::move(c.meta);
  for (const auto& [path, d] : c.datasets) {
    auto t = torch::empty(d.shape, d.dtype->type);
    if (t.numel() > 0) {
      const Hid dataset(H5Dopen2(f, path.c_str(), H5P_DEFAULT), H5Dclose);
      if (dataset.get() < 0 ||
          H5Dread(dataset.get(), d.dtype->mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()) < 0) {
        fail("is damaged: dataset /" + path + ": " + hdf5_error_text());
      }
    }
    if (d.crc >= 0 && crc_of(t.data_ptr(), static_cast<size_t>(t.nbytes())) != static_cast<uint32_t>(d.crc)) {
      fail("is corrupt: the CRC-32 of dataset /" + path + " does not match the one stored with it");
    }
    s.tensors[path] = t;
  }
  const uint32_t expected = c.version >= kParallelFormat ? manifest_checksum(c.datasets, s) : checksum(s);
  if (static_cast<int64_t>(expected) != c.stored_checksum) fail("is corrupt: its checksum does not match its contents");
  return s;
}

}  // namespace

void write_snapshot(const std::string& path, const Snapshot& snapshot) {
  detail::quiet_hdf5();
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp")).string();
  try {
    write_synced(tmp, file_image(snapshot));
    std::error_code ec;
    fs::rename(tmp, target, ec);
    MPIDDP_CHECK(!ec, "cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
    fsync_directory(dir.string());
  } catch (const Error& e) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    MPIDDP_THROW("cannot write snapshot '" + path + "': " + e.message());
  }
}

std::vector<char> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MPIDDP_CHECK(in.good(), "cannot open '" + path + "': " + std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MPIDDP_CHECK(!in.bad(), "cannot read '" + path + "'");
  return bytes;
}

Snapshot read_snapshot_image(const std::vector<char>& image, const std::string& name) {
  detail::quiet_hdf5();
  MPIDDP_CHECK(!image.empty(), "snapshot '" + name + "' is empty");
  const size_t sig = sizeof kHdf5Signature - 1;
  const bool legacy = image.size() >= sig && std::equal(kHdf5Signature, kHdf5Signature + sig, image.begin());
  if (!legacy) {
    const std::string magic = std::string(kSnapshotFormat) + " ";
    MPIDDP_CHECK(image.size() < magic.size() ? std::equal(image.begin(), image.end(), magic.begin())
                                             : std::equal(magic.begin(), magic.end(), image.begin()),
                 "snapshot '" + name +
                     "' is not an mpiddp snapshot (it starts neither with mpiddp's header nor with HDF5's signature)");
    // Before HDF5 reads a byte of it: format 3's layout, or format 2's whole-file CRC.
    const std::string first(image.data(), std::min(image.size(), kUserBlock));
    if (layout_header_size(first) > 0) {
      verify_layout(name, image.size(),
                    [&](uint64_t at, uint64_t n, char* into) { std::memcpy(into, image.data() + at, n); });
    } else {
      Header header;
      verify_image(image, name, header);
    }
  }
  Hid fapl(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  MPIDDP_CHECK_HDF5(H5Pset_fapl_core(fapl.get(), 1 << 20, 0));
  MPIDDP_CHECK_HDF5(H5Pset_file_image(fapl.get(), const_cast<char*>(image.data()), image.size()));
  // The core driver refuses a name that exists on disk when given an image: use one that cannot.
  const std::string memory_name = "/dev/null/mpiddp-image/" + name;
  const hid_t f = H5Fopen(memory_name.c_str(), H5F_ACC_RDONLY, fapl.get());
  MPIDDP_CHECK(f >= 0, "snapshot '" + name +
                           "' is not a readable HDF5 file (truncated or damaged: " + detail::hdf5_error_text() + ")");
  Hid file(f, H5Fclose);
  return read_open(file.get(), name);
}

Snapshot read_snapshot(const std::string& path) {
  MPIDDP_CHECK(fs::exists(path), "snapshot '" + path + "' does not exist");
  return read_snapshot_image(read_file_bytes(path), path);
}

SnapshotDir::SnapshotDir(std::string dir) : dir_(std::move(dir)) {}

void SnapshotDir::ensure_writable() const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  MPIDDP_CHECK(!ec && fs::is_directory(dir_), "snapshot directory '" + dir_ + "' cannot be created: " +
                                                  (ec ? ec.message() : std::string("not a directory")));
  const std::string probe = (fs::path(dir_) / ".mpiddp-write-test").string();
  {
    std::ofstream out(probe);
    out << "probe\n";
    out.flush();
    MPIDDP_CHECK(out.good(), "snapshot directory '" + dir_ + "' is not writable: " + std::strerror(errno));
  }
  fs::remove(probe, ec);
  // A run killed while writing leaves its temporary file; the snapshot it was to be never counted.
  static const std::regex unfinished(R"(\.snapshot-step\d+\.h5\.tmp)");
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (std::regex_match(entry.path().filename().string(), unfinished)) fs::remove(entry.path(), ec);
  }
}

std::string SnapshotDir::path_of(int64_t global_step) const {
  std::ostringstream name;
  name << "snapshot-step" << std::setw(10) << std::setfill('0') << global_step << ".h5";
  return (fs::path(dir_) / name.str()).string();
}

std::string SnapshotDir::save(const Snapshot& snapshot, int64_t global_step, int keep) const {
  const std::string path = path_of(global_step);
  write_snapshot(path, snapshot);
  publish(path, keep);
  return path;
}

void SnapshotDir::publish(const std::string& path, int keep) const {
  // latest.h5 -> the new file, swapped in by rename so it never dangles half-made.
  const std::string name = fs::path(path).filename().string();
  const fs::path link = fs::path(dir_) / "latest.h5", tmp_link = fs::path(dir_) / ".latest.h5.tmp";
  std::error_code ec;
  fs::remove(tmp_link, ec);
  fs::create_symlink(name, tmp_link, ec);
  if (!ec) fs::rename(tmp_link, link, ec);
  MPIDDP_CHECK(!ec, "cannot point '" + link.string() + "' at '" + name + "': " + ec.message());
  if (keep > 0) {
    const auto all = list();
    for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) fs::remove(all[i], ec);
  }
}

std::vector<std::string> SnapshotDir::list() const {
  static const std::regex pattern(R"(snapshot-step(\d+)\.h5)");
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, pattern)) found.emplace_back(std::stoll(m[1].str()), entry.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

}  // namespace mpiddp
