#include "snapshot/snapshot_format.hpp"

#include <mpiddp/error.hpp>

#include <zlib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "common/check_hdf5.hpp"

namespace mpiddp::detail {

namespace {

const std::vector<DtypeInfo>& dtypes() {
  static const std::vector<DtypeInfo> all = {{torch::kFloat, "float32", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT},
                                             {torch::kDouble, "float64", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE},
                                             {torch::kBFloat16, "bfloat16", H5T_STD_U16LE, H5T_NATIVE_UINT16},
                                             {torch::kHalf, "float16", H5T_STD_U16LE, H5T_NATIVE_UINT16},
                                             {torch::kInt, "int32", H5T_STD_I32LE, H5T_NATIVE_INT32},
                                             {torch::kLong, "int64", H5T_STD_I64LE, H5T_NATIVE_INT64},
                                             {torch::kByte, "uint8", H5T_STD_U8LE, H5T_NATIVE_UINT8}};
  return all;
}

}  // namespace

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

uint32_t crc_update(uint32_t crc, const void* data, size_t n) {
  uLong c = crc;
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // crc32 takes uInt lengths
    const auto piece = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = crc32(c, p, piece);
    p += piece;
    n -= piece;
  }
  return static_cast<uint32_t>(c);
}

uint32_t crc_of(const void* data, size_t n) { return crc_update(static_cast<uint32_t>(crc32(0L, Z_NULL, 0)), data, n); }

uint32_t crc_combine(uint32_t first, uint32_t second, int64_t second_bytes) {
  return static_cast<uint32_t>(crc32_combine(first, second, static_cast<z_off_t>(second_bytes)));
}

std::string user_block(int64_t version, uint64_t file_bytes, uint32_t crc) {
  char text[128];
  const auto v = static_cast<long long>(version);
  const auto b = static_cast<unsigned long long>(file_bytes);
  const int n = std::snprintf(text, sizeof text, "%s %lld\nbytes %llu\ncrc32-after-512 %08x\n", kSnapshotFormat, v, b,
                              static_cast<unsigned>(crc));
  std::string block(text, static_cast<size_t>(n));
  block.resize(kUserBlock, '\0');
  return block;
}

bool parse_user_block(const std::string& block, Header& h) {
  if (block.size() != kUserBlock) return false;
  long long version = 0;
  unsigned long long bytes = 0;
  unsigned crc = 0;
  const std::string head = std::string(kSnapshotFormat) + " %lld\nbytes %llu\n";
  const int got = std::sscanf(block.c_str(), (head + "crc32-after-512 %8x\n").c_str(), &version, &bytes, &crc);
  if (got != 3 || version != kWholeFileFormat) return false;
  h = {version, bytes, crc};
  return block == user_block(h.version, h.bytes, h.crc);
}

uint64_t layout_header_bytes(size_t datasets) {
  uint64_t bytes = kUserBlock;
  while (bytes < 256 + 48 * static_cast<uint64_t>(datasets)) bytes *= 2;  // an extent takes at most 45 characters
  return bytes;
}

std::string layout_block(const Layout& l) {
  const nlohmann::json j = {{"bytes", l.file_bytes}, {"structure_crc32", l.structure_crc}, {"raw", l.raw}};
  std::string block = std::string(kSnapshotFormat) + " " + std::to_string(kParallelFormat) + " header " +
                      std::to_string(l.header_bytes) + "\n" + j.dump() + "\n";
  MPIDDP_CHECK(block.size() <= l.header_bytes,
               "snapshot header overflows its " + std::to_string(l.header_bytes) + " bytes");
  block.resize(l.header_bytes, '\0');
  return block;
}

uint64_t layout_header_size(const std::string& first_block) {
  long long version = 0;
  unsigned long long bytes = 0;
  const std::string pattern = std::string(kSnapshotFormat) + " %lld header %llu\n";
  if (std::sscanf(first_block.c_str(), pattern.c_str(), &version, &bytes) != 2 || version != kParallelFormat) return 0;
  if (bytes < kUserBlock || (bytes & (bytes - 1)) != 0 || bytes > (uint64_t{1} << 30)) return 0;
  return bytes;
}

bool parse_layout_block(const std::string& block, Layout& l) {
  l.header_bytes = layout_header_size(block.substr(0, kUserBlock));
  if (l.header_bytes == 0 || block.size() != l.header_bytes) return false;
  const size_t from = block.find('\n') + 1, to = block.find('\n', from);
  if (to == std::string::npos) return false;
  const auto j = nlohmann::json::parse(block.substr(from, to - from), nullptr, false);
  try {
    l.file_bytes = j.at("bytes").get<uint64_t>();
    l.structure_crc = j.at("structure_crc32").get<uint32_t>();
    l.raw = j.at("raw").get<std::vector<std::pair<uint64_t, uint64_t>>>();
    return block == layout_block(l);  // nothing else, byte for byte
  } catch (const std::exception&) {
    return false;
  }
}

uint32_t structure_crc(const Layout& l, const std::function<void(uint64_t, uint64_t, char*)>& read) {
  uint32_t crc = crc_of(nullptr, 0);
  std::vector<char> buffer;
  uint64_t at = l.header_bytes;
  auto add_until = [&](uint64_t end) {
    for (; at < end;) {
      const uint64_t n = std::min<uint64_t>(end - at, 4 << 20);
      buffer.resize(n);
      read(at, n, buffer.data());
      crc = crc_update(crc, buffer.data(), n);
      at += n;
    }
  };
  for (const auto& [offset, bytes] : l.raw) {
    MPIDDP_CHECK(offset >= at && offset + bytes <= l.file_bytes,
                 "its layout header names overlapping or outside extents (" + std::to_string(offset) + "+" +
                     std::to_string(bytes) + " after " + std::to_string(at) + " of " + std::to_string(l.file_bytes) +
                     ")");
    add_until(offset);
    at = offset + bytes;
  }
  add_until(l.file_bytes);
  return crc;
}

void verify_layout(const std::string& name, uint64_t size, const std::function<void(uint64_t, uint64_t, char*)>& read) {
  auto fail = [&](const std::string& why) { MPIDDP_THROW("snapshot '" + name + "' " + why); };
  std::string first(std::min<uint64_t>(size, kUserBlock), '\0');
  read(0, first.size(), first.data());
  const uint64_t header = layout_header_size(first);
  if (header == 0 || header > size) {
    if (header > size || size < kUserBlock)
      fail("is truncated: " + std::to_string(size) + " bytes, less than its header");
    fail("is damaged: its header is not one mpiddp writes");
  }
  std::string block(header, '\0');
  read(0, header, block.data());
  Layout l;
  if (!parse_layout_block(block, l)) fail("is damaged: its header is not one mpiddp writes");
  if (l.file_bytes != size) {
    fail(std::string(size < l.file_bytes ? "is truncated" : "has bytes appended") + ": " + std::to_string(size) +
         " bytes where its header says " + std::to_string(l.file_bytes));
  }
  uint32_t crc = 0;
  try {
    crc = structure_crc(l, read);
  } catch (const Error& e) {
    fail("is damaged: " + e.message());
  }
  if (crc != l.structure_crc) {
    fail(
        "is corrupt: the CRC-32 of its HDF5 structure does not match the one in its header (damaged on disk or in "
        "transit)");
  }
}

void write_text_attr(hid_t obj, const std::string& name, const std::string& value) {
  Hid type(MPIDDP_CHECK_HDF5(H5Tcopy(H5T_C_S1)), H5Tclose);
  MPIDDP_CHECK_HDF5(H5Tset_size(type.get(), H5T_VARIABLE));
  MPIDDP_CHECK_HDF5(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  const char* p = value.c_str();
  write_scalar_attr(obj, name, type.get(), &p);
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

int64_t DatasetEntry::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

uint32_t attributes_checksum(uint32_t crc, const Snapshot& meta) {
  auto add = [&](const void* data, size_t n) { crc = crc_update(crc, data, n); };
  auto add_text = [&](const std::string& t) { add(t.c_str(), t.size() + 1); };
  for (const auto& [name, v] : meta.ints) add_text(name), add(&v, sizeof v);
  for (const auto& [name, v] : meta.reals) add_text(name), add(&v, sizeof v);
  for (const auto& [name, v] : meta.texts) add_text(name), add_text(v);
  return crc;
}

uint32_t manifest_checksum(const std::map<std::string, DatasetEntry>& datasets, const Snapshot& meta) {
  uint32_t crc = crc_of(nullptr, 0);
  for (const auto& [name, d] : datasets) {
    crc = crc_update(crc, name.c_str(), name.size() + 1);
    crc = crc_update(crc, d.dtype->name, std::char_traits<char>::length(d.dtype->name) + 1);
    for (auto n : d.shape) crc = crc_update(crc, &n, sizeof n);
    crc = crc_update(crc, &d.crc, sizeof d.crc);
  }
  return attributes_checksum(crc, meta);
}

namespace {

int64_t read_int_attr(hid_t obj, const char* name) {
  Hid a(MPIDDP_CHECK_HDF5(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
  int64_t v = 0;
  MPIDDP_CHECK_HDF5(H5Aread(a.get(), H5T_NATIVE_INT64, &v));
  return v;
}

// Root attributes, by class. (H5Aiterate2, H5Gget_info, H5Lget_name_by_idx and H5Oopen keep their
// signatures from HDF5 1.8 to 2.x, unlike the H5Oget_info/H5Ovisit families.)
void read_root_attributes(hid_t f, Catalog& c) {
  struct Visit {
    Catalog* c;
    std::string error;
  } visit{&c, {}};
  auto on_attr = [](hid_t loc, const char* an, const H5A_info_t*, void* data) -> herr_t {
    auto* v = static_cast<Visit*>(data);
    try {
      const std::string key = an;
      if (key == "format") return 0;
      if (key == "format_version") return v->c->version = read_int_attr(loc, an), 0;
      if (key == kChecksumAttr) return v->c->stored_checksum = read_int_attr(loc, an), 0;
      Hid a(MPIDDP_CHECK_HDF5(H5Aopen(loc, an, H5P_DEFAULT)), H5Aclose);
      Hid type(MPIDDP_CHECK_HDF5(H5Aget_type(a.get())), H5Tclose);
      const auto cls = H5Tget_class(type.get());
      if (cls == H5T_INTEGER) {
        v->c->meta.ints[key] = read_int_attr(loc, an);
      } else if (cls == H5T_FLOAT) {
        double x = 0;
        MPIDDP_CHECK_HDF5(H5Aread(a.get(), H5T_NATIVE_DOUBLE, &x));
        v->c->meta.reals[key] = x;
      } else if (cls == H5T_STRING) {
        v->c->meta.texts[key] = read_text_attr(a.get());
      }
    } catch (const Error& e) {
      v->error = "attribute " + std::string(an) + ": " + e.message();
      return 1;
    }
    return 0;
  };
  const herr_t rc = H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, nullptr, on_attr, &visit);
  MPIDDP_CHECK(visit.error.empty(), visit.error);
  MPIDDP_CHECK(rc >= 0, hdf5_error_text());
}

DatasetEntry read_entry(hid_t dataset, const std::string& path) {
  DatasetEntry d;
  MPIDDP_CHECK(H5Aexists(dataset, kDtypeAttr) > 0, "dataset /" + path + " has no dtype attribute");
  Hid a(MPIDDP_CHECK_HDF5(H5Aopen(dataset, kDtypeAttr, H5P_DEFAULT)), H5Aclose);
  const auto dtname = read_text_attr(a.get());
  d.dtype = dtype_named(dtname);
  MPIDDP_CHECK(d.dtype, "dataset /" + path + " has unknown dtype '" + dtname + "'");
  Hid space(MPIDDP_CHECK_HDF5(H5Dget_space(dataset)), H5Sclose);
  const int nd = MPIDDP_CHECK_HDF5(H5Sget_simple_extent_ndims(space.get()));
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  if (nd > 0) MPIDDP_CHECK_HDF5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  d.shape.assign(dims.begin(), dims.end());
  if (H5Aexists(dataset, kCrcAttr) > 0) d.crc = read_int_attr(dataset, kCrcAttr);
  return d;
}

}  // namespace

Catalog read_catalog(hid_t f, const std::string& name) {
  auto fail = [&](const std::string& why) { MPIDDP_THROW("snapshot '" + name + "' " + why); };
  if (H5Aexists(f, "format") <= 0) fail("is not an mpiddp snapshot (no format attribute)");
  {
    Hid a(MPIDDP_CHECK_HDF5(H5Aopen(f, "format", H5P_DEFAULT)), H5Aclose);
    if (read_text_attr(a.get()) != kSnapshotFormat) fail("is not an mpiddp snapshot");
  }
  if (H5Aexists(f, kChecksumAttr) <= 0) fail("has no checksum (incomplete or not an mpiddp snapshot)");
  Catalog c;
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
      if (H5Iget_type(obj.get()) == H5I_GROUP)
        walk(obj.get(), path + "/");
      else if (H5Iget_type(obj.get()) == H5I_DATASET)
        c.datasets[path] = read_entry(obj.get(), path);
    }
  };
  try {
    read_root_attributes(f, c);
    walk(f, "");
  } catch (const Error& e) {
    fail("is damaged: " + e.message());
  }
  for (const auto& [path, d] : c.datasets) {
    if (c.version >= kParallelFormat && d.crc < 0) fail("is damaged: dataset /" + path + " has no crc32 attribute");
  }
  return c;
}

namespace {

// Boxes (start, count) covering elements [a, b) of the row-major array `dims` from dimension d on,
// each prefixed by `prefix` (the fixed indices of the dimensions before d).
void flat_boxes(const std::vector<hsize_t>& dims, size_t d, hsize_t a, hsize_t b, std::vector<hsize_t>& prefix,
                std::vector<std::pair<std::vector<hsize_t>, std::vector<hsize_t>>>& out) {
  auto box = [&](hsize_t first, hsize_t rows, size_t dim) {
    std::vector<hsize_t> start(prefix), count(prefix.size(), 1);
    start.push_back(first);
    count.push_back(rows);
    for (size_t k = dim + 1; k < dims.size(); ++k) start.push_back(0), count.push_back(dims[k]);
    out.emplace_back(std::move(start), std::move(count));
  };
  if (d + 1 == dims.size()) return box(a, b - a, d);
  hsize_t inner = 1;
  for (size_t k = d + 1; k < dims.size(); ++k) inner *= dims[k];
  const hsize_t r0 = a / inner, r1 = (b - 1) / inner;
  auto within = [&](hsize_t row, hsize_t lo, hsize_t hi) {
    prefix.push_back(row);
    flat_boxes(dims, d + 1, lo, hi, prefix, out);
    prefix.pop_back();
  };
  if (r0 == r1 && (a % inner != 0 || b % inner != 0)) return within(r0, a - r0 * inner, b - r0 * inner);
  const hsize_t full_begin = a % inner == 0 ? r0 : r0 + 1, full_end = b % inner == 0 ? r1 + 1 : r1;
  if (a % inner != 0) within(r0, a % inner, inner);
  if (full_begin < full_end) box(full_begin, full_end - full_begin, d);
  if (b % inner != 0) within(r1, 0, b - r1 * inner);
}

}  // namespace

void select_flat_range(hid_t space, const std::vector<int64_t>& shape, int64_t first, int64_t count) {
  if (count == 0) {
    MPIDDP_CHECK_HDF5(H5Sselect_none(space));
    return;
  }
  if (shape.empty()) {  // a scalar: its one element
    MPIDDP_CHECK_HDF5(H5Sselect_all(space));
    return;
  }
  std::vector<hsize_t> dims(shape.begin(), shape.end()), prefix;
  std::vector<std::pair<std::vector<hsize_t>, std::vector<hsize_t>>> boxes;
  flat_boxes(dims, 0, static_cast<hsize_t>(first), static_cast<hsize_t>(first + count), prefix, boxes);
  for (size_t i = 0; i < boxes.size(); ++i) {
    MPIDDP_CHECK_HDF5(H5Sselect_hyperslab(space, i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, boxes[i].first.data(),
                                          nullptr, boxes[i].second.data(), nullptr));
  }
}

}  // namespace mpiddp::detail
