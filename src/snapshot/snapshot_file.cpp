#include <mpiddp/snapshot.hpp>
#include <mpiddp/error.hpp>

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

namespace mpiddp {
namespace {

namespace fs = std::filesystem;
using detail::Hid;

constexpr const char* kFormat = "mpiddp-snapshot";
constexpr int64_t kFormatVersion = 2;
// Since format 2 every snapshot starts with a 512-byte HDF5 user block (HDF5 and h5py skip it)
// that holds a text header: the file's size and a CRC-32 (zlib) of every byte after the block.
// A reader checks both on the bytes it already holds before HDF5 parses anything, so damage
// anywhere in the file is refused without HDF5 ever walking damaged metadata. Format 1 files
// (no user block; they start with HDF5's signature) are still read, with only the inner checksum.
constexpr size_t kUserBlock = 512;
constexpr const char kHdf5Signature[] = "\x89HDF\r\n\x1a\n";
constexpr const char* kChecksumAttr = "checksum_crc32";
constexpr const char* kDtypeAttr = "dtype";

struct DtypeInfo {
  c10::ScalarType type;
  const char* name;
  hid_t file_type, mem_type;  // bf16/f16 travel as their 16-bit patterns, named by the dtype attribute
};

const std::vector<DtypeInfo>& dtypes() {
  static const std::vector<DtypeInfo> all = {
          {torch::kFloat, "float32", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT},
          {torch::kDouble, "float64", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE},
          {torch::kBFloat16, "bfloat16", H5T_STD_U16LE, H5T_NATIVE_UINT16},
          {torch::kHalf, "float16", H5T_STD_U16LE, H5T_NATIVE_UINT16},
          {torch::kInt, "int32", H5T_STD_I32LE, H5T_NATIVE_INT32},
          {torch::kLong, "int64", H5T_STD_I64LE, H5T_NATIVE_INT64},
          {torch::kByte, "uint8", H5T_STD_U8LE, H5T_NATIVE_UINT8}};
  return all;
}

const DtypeInfo& dtype_of(c10::ScalarType t) {
  for (const auto& d : dtypes()) {
    if (d.type == t) return d;
  }
  MPIDDP_THROW(std::string("snapshot: unsupported tensor dtype ") + c10::toString(t));
}

const DtypeInfo* dtype_named(const std::string& name) {
  for (const auto& d : dtypes()) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

// zlib's CRC-32 of `crc` extended by n bytes (crc32 takes uInt lengths).
uLong crc_update(uLong crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const auto piece = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, p, piece);
    p += piece;
    n -= piece;
  }
  return crc;
}

uint32_t crc32_of(const char* data, size_t n) { return static_cast<uint32_t>(crc_update(crc32(0L, Z_NULL, 0), data, n)); }

// The user block's text, NUL-padded to kUserBlock bytes: the only form a reader accepts.
std::string user_block(uint64_t file_bytes, uint32_t crc) {
  char text[128];
  const int n = std::snprintf(text, sizeof text, "%s %lld\nbytes %llu\ncrc32-after-512 %08x\n", kFormat,
                              static_cast<long long>(kFormatVersion), static_cast<unsigned long long>(file_bytes),
                              static_cast<unsigned>(crc));
  std::string block(text, static_cast<size_t>(n));
  block.resize(kUserBlock, '\0');
  return block;
}

// Verifies a format-2 image's user block against its bytes; throws naming what is wrong.
void verify_whole_file(const std::vector<char>& image, const std::string& name) {
  auto fail = [&](const std::string& why) { MPIDDP_THROW("snapshot '" + name + "' " + why); };
  if (image.size() < kUserBlock) {
    fail("is truncated: " + std::to_string(image.size()) + " bytes, less than its " + std::to_string(kUserBlock) +
         "-byte header");
  }
  unsigned long long bytes = 0;
  unsigned crc = 0;
  long long version = 0;
  const std::string head(image.data(), kUserBlock);
  const std::string pattern = std::string(kFormat) + " %lld\nbytes %llu\ncrc32-after-512 %8x\n";
  if (std::sscanf(head.c_str(), pattern.c_str(), &version, &bytes, &crc) != 3 || version != kFormatVersion ||
      head != user_block(bytes, crc)) {
    fail("is damaged: its 512-byte header is not one mpiddp writes");
  }
  if (bytes != image.size()) {
    fail(std::string(image.size() < bytes ? "is truncated" : "has bytes appended") + ": " +
         std::to_string(image.size()) + " bytes where its header says " + std::to_string(bytes));
  }
  if (crc32_of(image.data() + kUserBlock, image.size() - kUserBlock) != crc) {
    fail("is corrupt: the CRC-32 of its bytes does not match the one in its header (damaged on disk or in transit)");
  }
}

// CRC-32 over everything a snapshot holds, in the maps' (sorted) order, so writer and reader
// agree without storing any order.
uint32_t checksum(const Snapshot& s) {
  uLong crc = crc32(0L, Z_NULL, 0);
  auto add = [&](const void* data, size_t n) { crc = crc_update(crc, data, n); };
  auto add_text = [&](const std::string& t) { add(t.c_str(), t.size() + 1); };
  for (const auto& [name, t] : s.tensors) {
    add_text(name);
    add_text(dtype_of(t.scalar_type()).name);
    for (auto d : t.sizes()) add(&d, sizeof d);
    auto c = t.contiguous();
    add(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  for (const auto& [name, v] : s.ints) add_text(name), add(&v, sizeof v);
  for (const auto& [name, v] : s.reals) add_text(name), add(&v, sizeof v);
  for (const auto& [name, v] : s.texts) add_text(name), add_text(v);
  return static_cast<uint32_t>(crc);
}

void write_text_attr(hid_t obj, const std::string& name, const std::string& value) {
  Hid type(MPIDDP_CHECK_HDF5(H5Tcopy(H5T_C_S1)), H5Tclose);
  MPIDDP_CHECK_HDF5(H5Tset_size(type.get(), H5T_VARIABLE));
  MPIDDP_CHECK_HDF5(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  const char* p = value.c_str();
  detail::write_scalar_attr(obj, name, type.get(), &p);
}

std::string read_text_attr(hid_t attr) {
  Hid type(MPIDDP_CHECK_HDF5(H5Aget_type(attr)), H5Tclose);
  if (H5Tis_variable_str(type.get()) > 0) {
    char* p = nullptr;
    MPIDDP_CHECK_HDF5(H5Aread(attr, type.get(), &p));
    std::string v = p ? p : "";
    H5free_memory(p);
    return v;
  }
  std::string v(H5Tget_size(type.get()), '\0');
  MPIDDP_CHECK_HDF5(H5Aread(attr, type.get(), v.data()));
  return v.substr(0, v.find('\0'));
}

// HDF5 builds the file in memory (core driver, no backing store); the caller writes the bytes
// itself, so a full disk or an I/O error is one errno and never leaves an HDF5 file half open.
std::vector<char> file_image(const Snapshot& s) {
  Hid fapl(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  MPIDDP_CHECK_HDF5(H5Pset_fapl_core(fapl.get(), 1 << 20, 0));
  Hid f(MPIDDP_CHECK_HDF5(H5Fcreate("/dev/null/mpiddp-new-snapshot", H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get())), H5Fclose);
  Hid lcpl(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
  MPIDDP_CHECK_HDF5(H5Pset_create_intermediate_group(lcpl.get(), 1));
  for (const auto& [name, tensor] : s.tensors) {
    const auto& dt = dtype_of(tensor.scalar_type());
    auto c = tensor.detach().cpu().contiguous();
    std::vector<hsize_t> dims(c.sizes().begin(), c.sizes().end());
    Hid space(MPIDDP_CHECK_HDF5(dims.empty() ? H5Screate(H5S_SCALAR)
                                             : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
              H5Sclose);
    Hid d(MPIDDP_CHECK_HDF5(H5Dcreate2(f.get(), name.c_str(), dt.file_type, space.get(), lcpl.get(), H5P_DEFAULT,
                                       H5P_DEFAULT)),
          H5Dclose);
    if (c.numel() > 0) MPIDDP_CHECK_HDF5(H5Dwrite(d.get(), dt.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, c.data_ptr()));
    write_text_attr(d.get(), kDtypeAttr, dt.name);
  }
  write_text_attr(f.get(), "format", kFormat);
  detail::write_scalar_attr(f.get(), "format_version", H5T_NATIVE_INT64, &kFormatVersion);
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
  const auto block = user_block(image.size(), crc32_of(image.data() + kUserBlock, image.size() - kUserBlock));
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

// Reads every object of an open snapshot file into a Snapshot.
Snapshot read_open(hid_t f, const std::string& name) {
  Snapshot s;
  auto fail = [&](const std::string& why) { MPIDDP_THROW("snapshot '" + name + "' " + why); };
  if (H5Aexists(f, "format") <= 0) fail("is not an mpiddp snapshot (no format attribute)");
  {
    Hid a(MPIDDP_CHECK_HDF5(H5Aopen(f, "format", H5P_DEFAULT)), H5Aclose);
    if (read_text_attr(a.get()) != kFormat) fail("is not an mpiddp snapshot");
  }
  if (H5Aexists(f, kChecksumAttr) <= 0) fail("has no checksum (incomplete or not an mpiddp snapshot)");
  // Root attributes, by class. (H5Aiterate2, H5Gget_info, H5Lget_name_by_idx and H5Oopen keep
  // their signatures from HDF5 1.8 to 1.14, unlike the H5Oget_info/H5Ovisit families.)
  struct Attrs {
    Snapshot* s;
    int64_t crc = -1;
    std::string error;
  } attrs{&s, -1, {}};
  auto on_attr = [](hid_t loc, const char* an, const H5A_info_t*, void* data) -> herr_t {
    auto* at = static_cast<Attrs*>(data);
    try {
      const std::string key = an;
      if (key == "format" || key == "format_version") return 0;
      Hid a(MPIDDP_CHECK_HDF5(H5Aopen(loc, an, H5P_DEFAULT)), H5Aclose);
      Hid type(MPIDDP_CHECK_HDF5(H5Aget_type(a.get())), H5Tclose);
      const auto cls = H5Tget_class(type.get());
      if (cls == H5T_INTEGER) {
        int64_t v = 0;
        MPIDDP_CHECK_HDF5(H5Aread(a.get(), H5T_NATIVE_INT64, &v));
        if (key == kChecksumAttr) at->crc = v;
        else at->s->ints[key] = v;
      } else if (cls == H5T_FLOAT) {
        double v = 0;
        MPIDDP_CHECK_HDF5(H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v));
        at->s->reals[key] = v;
      } else if (cls == H5T_STRING) {
        at->s->texts[key] = read_text_attr(a.get());
      }
    } catch (const Error& e) {
      at->error = "attribute " + std::string(an) + ": " + e.message();
      return 1;
    }
    return 0;
  };
  const herr_t arc = H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, nullptr, on_attr, &attrs);
  if (!attrs.error.empty()) fail("is damaged: " + attrs.error);
  if (arc < 0) fail("is damaged: " + detail::hdf5_error_text());

  // Datasets, at any depth.
  std::function<void(hid_t, const std::string&)> walk = [&](hid_t group, const std::string& prefix) {
    H5G_info_t info;
    MPIDDP_CHECK_HDF5(H5Gget_info(group, &info));
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      const ssize_t len =
          MPIDDP_CHECK_HDF5(H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT));
      std::string link(static_cast<size_t>(len) + 1, '\0');
      MPIDDP_CHECK_HDF5(
          H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, link.data(), link.size(), H5P_DEFAULT));
      link.resize(static_cast<size_t>(len));
      const std::string path = prefix + link;
      Hid obj(MPIDDP_CHECK_HDF5(H5Oopen(group, link.c_str(), H5P_DEFAULT)), H5Oclose);
      if (H5Iget_type(obj.get()) == H5I_GROUP) {
        walk(obj.get(), path + "/");
        continue;
      }
      if (H5Iget_type(obj.get()) != H5I_DATASET) continue;
      MPIDDP_CHECK(H5Aexists(obj.get(), kDtypeAttr) > 0, "dataset /" + path + " has no dtype attribute");
      Hid a(MPIDDP_CHECK_HDF5(H5Aopen(obj.get(), kDtypeAttr, H5P_DEFAULT)), H5Aclose);
      const auto dtname = read_text_attr(a.get());
      const DtypeInfo* dt = dtype_named(dtname);
      MPIDDP_CHECK(dt, "dataset /" + path + " has unknown dtype '" + dtname + "'");
      Hid space(MPIDDP_CHECK_HDF5(H5Dget_space(obj.get())), H5Sclose);
      const int nd = MPIDDP_CHECK_HDF5(H5Sget_simple_extent_ndims(space.get()));
      std::vector<hsize_t> dims(static_cast<size_t>(nd));
      if (nd > 0) MPIDDP_CHECK_HDF5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
      auto t = torch::empty(std::vector<int64_t>(dims.begin(), dims.end()), dt->type);
      if (t.numel() > 0) {
        MPIDDP_CHECK_HDF5(H5Dread(obj.get(), dt->mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()));
      }
      s.tensors[path] = t;
    }
  };
  try {
    walk(f, "");
  } catch (const Error& e) {
    fail("is damaged: " + e.message());
  }
  const int64_t stored_crc = attrs.crc;
  if (static_cast<int64_t>(checksum(s)) != stored_crc) {
    fail("is corrupt: its checksum does not match its contents");
  }
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
    const std::string magic = std::string(kFormat) + " ";
    MPIDDP_CHECK(image.size() < magic.size() ? std::equal(image.begin(), image.end(), magic.begin())
                                             : std::equal(magic.begin(), magic.end(), image.begin()),
                 "snapshot '" + name + "' is not an mpiddp snapshot (it starts neither with mpiddp's header nor with HDF5's signature)");
    verify_whole_file(image, name);  // before HDF5 reads a byte of it
  }
  Hid fapl(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  MPIDDP_CHECK_HDF5(H5Pset_fapl_core(fapl.get(), 1 << 20, 0));
  MPIDDP_CHECK_HDF5(H5Pset_file_image(fapl.get(), const_cast<char*>(image.data()), image.size()));
  // The core driver refuses a name that exists on disk when given an image: use one that cannot.
  const std::string memory_name = "/dev/null/mpiddp-image/" + name;
  const hid_t f = H5Fopen(memory_name.c_str(), H5F_ACC_RDONLY, fapl.get());
  MPIDDP_CHECK(f >= 0, "snapshot '" + name + "' is not a readable HDF5 file (truncated or damaged: " +
                           detail::hdf5_error_text() + ")");
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
}

std::string SnapshotDir::save(const Snapshot& snapshot, int64_t global_step, int keep) const {
  std::ostringstream name;
  name << "snapshot-step" << std::setw(10) << std::setfill('0') << global_step << ".h5";
  const std::string path = (fs::path(dir_) / name.str()).string();
  write_snapshot(path, snapshot);
  // latest.h5 -> the new file, swapped in by rename so it never dangles half-made.
  const fs::path link = fs::path(dir_) / "latest.h5", tmp_link = fs::path(dir_) / ".latest.h5.tmp";
  std::error_code ec;
  fs::remove(tmp_link, ec);
  fs::create_symlink(name.str(), tmp_link, ec);
  if (!ec) fs::rename(tmp_link, link, ec);
  MPIDDP_CHECK(!ec, "cannot point '" + link.string() + "' at '" + name.str() + "': " + ec.message());
  if (keep > 0) {
    const auto all = list();
    for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) fs::remove(all[i], ec);
  }
  return path;
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
