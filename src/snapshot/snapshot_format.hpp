// Internal: what every snapshot file shares, whoever writes it (snapshot_file.cpp: one process,
// the whole Snapshot; parallel_snapshot.cpp: every rank its part): the 512-byte header, the
// dtypes, the CRC-32s and the text attributes. The schema itself: docs/snapshots.md.
#pragma once

#include <mpiddp/snapshot.hpp>

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mpiddp::detail {

constexpr const char* kSnapshotFormat = "mpiddp-snapshot";
/// Format 3 (written by every rank): the header holds the file's layout (Layout); each dataset its CRC-32.
/// Format 2 (one writer): the header holds the size and a CRC-32 of every byte after it.
/// Format 1: no header. All three are read.
constexpr int64_t kParallelFormat = 3;
constexpr int64_t kWholeFileFormat = 2;
/// Every snapshot since format 2 starts with a user block (HDF5 and h5py skip it) holding a text
/// header that a reader checks before HDF5 parses a byte.
constexpr size_t kUserBlock = 512;
constexpr const char kHdf5Signature[] = "\x89HDF\r\n\x1a\n";
constexpr const char* kChecksumAttr = "checksum_crc32";  ///< root: the contents' CRC-32
constexpr const char* kDtypeAttr = "dtype";              ///< each dataset: its torch dtype's name
constexpr const char* kCrcAttr = "crc32";                ///< each dataset (format 3): its bytes' CRC-32

struct DtypeInfo {
  c10::ScalarType type;
  const char* name;
  hid_t file_type, mem_type;  // bf16/f16 travel as their 16-bit patterns, named by the dtype attribute
};
const DtypeInfo& dtype_of(c10::ScalarType t);
const DtypeInfo* dtype_named(const std::string& name);

/// zlib's CRC-32 of `crc` extended by n bytes; crc_of(p, n) from the start.
uint32_t crc_update(uint32_t crc, const void* data, size_t n);
uint32_t crc_of(const void* data, size_t n);
/// The CRC-32 of two byte runs end to end, from theirs and the second's length.
uint32_t crc_combine(uint32_t first, uint32_t second, int64_t second_bytes);

/// The header's text, NUL-padded to kUserBlock bytes; `crc` only in format 2.
std::string user_block(int64_t version, uint64_t file_bytes, uint32_t crc);
/// The header's fields, or nullopt when `block` is not exactly one user_block() writes.
struct Header {
  int64_t version = 0;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};
bool parse_user_block(const std::string& block, Header& header);

/// Format 3's header: its own size (HDF5's user block, a power of two from 512), the file's size,
/// where each dataset's raw bytes lie, and a CRC-32 of every other byte after the header (HDF5's
/// own structure), so that a reader checks the structure before HDF5 parses a byte of it. Text:
/// "mpiddp-snapshot 3 header <bytes>\n" and one line of JSON, NUL-padded.
struct Layout {
  uint64_t header_bytes = kUserBlock;
  uint64_t file_bytes = 0;
  uint32_t structure_crc = 0;
  std::vector<std::pair<uint64_t, uint64_t>> raw;  ///< (offset, bytes) of each dataset's data, sorted
};
/// Room for the header of a file of `datasets` datasets.
uint64_t layout_header_bytes(size_t datasets);
std::string layout_block(const Layout& layout);
/// The header's size from the file's first kUserBlock bytes; 0 when they do not start one.
uint64_t layout_header_size(const std::string& first_block);
/// The whole header's fields; false unless `block` is exactly one layout_block() writes.
bool parse_layout_block(const std::string& block, Layout& layout);
/// The CRC-32 of bytes [header_bytes, file_bytes) outside `raw`, read through read(offset, n, into).
uint32_t structure_crc(const Layout& layout, const std::function<void(uint64_t, uint64_t, char*)>& read);
/// Checks a format-3 file of `size` bytes, read through read(offset, n, into): its header, its size
/// and its structure's CRC-32. Throws naming `name` and what is wrong.
void verify_layout(const std::string& name, uint64_t size, const std::function<void(uint64_t, uint64_t, char*)>& read);

void write_text_attr(hid_t obj, const std::string& name, const std::string& value);
std::string read_text_attr(hid_t attr);

/// One dataset as the file describes it (format 3 adds its CRC-32).
struct DatasetEntry {
  const DtypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  int64_t crc = -1;  ///< -1: none stored (formats 1, 2)
  int64_t numel() const;
};

/// A format-3 file's root checksum: every dataset's name, dtype, shape and CRC-32 and every root
/// attribute of `meta`, in sorted order, so writer and reader agree without storing an order.
uint32_t manifest_checksum(const std::map<std::string, DatasetEntry>& datasets, const Snapshot& meta);
/// CRC-32 over the attributes of `meta` continued from `crc` (formats 2 and 3 end with it).
uint32_t attributes_checksum(uint32_t crc, const Snapshot& meta);

/// What a snapshot file says of itself before any tensor is read: its root attributes (in a
/// Snapshot without tensors), its stored checksum and its datasets.
struct Catalog {
  Snapshot meta;
  int64_t version = 1;
  int64_t stored_checksum = -1;
  std::map<std::string, DatasetEntry> datasets;
};
/// Reads the catalog of an open file; throws naming `name` and what is wrong.
Catalog read_catalog(hid_t file, const std::string& name);

/// Selects elements [first, first + count) of the flattened dataset `shape` in `space` (a union
/// of at most 2·rank - 1 hyperslabs, row-major as the elements lie); count 0 selects none.
void select_flat_range(hid_t space, const std::vector<int64_t>& shape, int64_t first, int64_t count);

}  // namespace mpiddp::detail
