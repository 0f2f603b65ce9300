// Internal: one snapshot file written and read by every rank of a communicator (format 3).
//
// Every rank declares the same tensors (name, dtype, shape, in the same order) and holds a part of
// each: a run of its flattened elements. The parts of a tensor do not overlap and together cover it
// (ZeRO's slices, or an even share of what every rank holds alike). With parallel HDF5 each rank
// writes its parts itself (MPI-IO, collective hyperslab writes) from the tensors' own memory; with a
// serial HDF5 rank 0 writes and the others send it their parts one tensor at a time. Either way no
// rank ever holds the whole state. Each dataset carries the CRC-32 of its bytes (the parts' CRCs
// combined in order), the root a checksum over the datasets' names, shapes and CRCs and the
// attributes, and the header (HDF5's user block, 512 bytes or more) the file's layout and the CRC
// of HDF5's own structure. The file is written under a temporary name
// and renamed by rank 0 once every rank's part is in; any rank's failure is every rank's error.
//
// Cross-rank contract: every rank calls write_parallel_snapshot, opens a SnapshotReader and calls
// its read() for the same tensors in the same order; each call is collective.
#pragma once

#include <mpiddp/snapshot.hpp>

#include <mpi.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/check_hdf5.hpp"
#include "runtime/agreement.hpp"
#include "snapshot/snapshot_format.hpp"

namespace mpiddp::detail {

/// One tensor of a snapshot as every rank declares it, and this rank's part of it: elements
/// [first, first + part.numel()) of the flattened tensor (undefined `part`: none).
struct TensorPart {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  int64_t first = 0;
  torch::Tensor part;
};

/// The part of `whole` (held alike by every rank) that rank `rank` of `size` writes: an even
/// share of its elements, a view of its own memory.
TensorPart even_share(const std::string& name, const torch::Tensor& whole, int rank, int size);
/// Rank `owner`'s `whole`, declared by every rank with `shape` (all of it written by `owner`).
TensorPart owned_by(int owner, int rank, const std::string& name, const torch::Tensor& whole);

/// How the bytes reach the file: every rank through MPI-IO, or rank 0 alone with the others
/// sending it their parts; kAuto: resolve_io()'s rule.
enum class SnapshotIo { kAuto, kParallel, kThroughRankZero };
/// From this many bytes of tensors on, kAuto writes and reads through MPI-IO. Below it, MPI-IO's
/// fixed costs (a collective open, a collective call per dataset, an fsync per rank) outweigh what
/// parallel writing saves: across two nodes of the test cluster a 4-rank snapshot of a small MLP
/// took 1.4 s through MPI-IO, milliseconds through rank 0. Either way no rank holds the whole state.
constexpr int64_t kParallelIoFromBytes = int64_t{16} << 20;
/// kAuto's choice for `bytes` of tensors: MPI-IO from kParallelIoFromBytes on where this build's
/// HDF5 is parallel, else through rank 0. Other values as they are.
SnapshotIo resolve_io(SnapshotIo io, int64_t bytes);

/// Proves that every rank sees the same directory `dir` (rank 0 writes a token there, every rank
/// reads it back): one file written by all ranks needs a file system they share. Throws the same
/// mpiddp::Error on every rank naming the first rank that does not. Collective.
void check_shared_directory(MPI_Comm comm, const std::string& dir);

/// Writes `tensors` (every rank's parts) and rank 0's `meta` (ints, reals, texts; its tensors are
/// ignored) to `path`, atomically as described above. Throws the same mpiddp::Error on every rank.
void write_parallel_snapshot(MPI_Comm comm, const std::string& path, const std::vector<TensorPart>& tensors,
                             const Snapshot& meta, SnapshotIo io = SnapshotIo::kAuto);

/// A snapshot file open on every rank, verified before it is used: the header, HDF5's own metadata,
/// every dataset's CRC-32 (each rank checks an even share, in bounded pieces) and the manifest.
/// Formats 1 and 2 are read as before: rank 0 reads the file and broadcasts its bytes.
class SnapshotReader {
 public:
  /// Collective; throws the same mpiddp::Error on every rank when any rank finds the file wanting.
  SnapshotReader(MPI_Comm comm, const std::string& path, SnapshotIo io = SnapshotIo::kAuto);
  ~SnapshotReader();
  SnapshotReader(const SnapshotReader&) = delete;
  SnapshotReader& operator=(const SnapshotReader&) = delete;

  const std::string& path() const { return path_; }
  /// The root attributes (no tensors).
  const Snapshot& meta() const { return meta_; }
  /// The dataset `name`, or nullptr.
  const DatasetEntry* find(const std::string& name) const;
  /// Reads elements [first, first + out.numel()) of tensor `name` into `out` (contiguous CPU, the
  /// tensor's dtype; undefined or empty: none). Collective. A failure is kept for verdict().
  void read(const std::string& name, int64_t first, torch::Tensor& out);
  /// The whole tensor `name`, on every rank. Collective; a failure is kept for verdict().
  torch::Tensor read_whole(const std::string& name);
  /// Throws the same mpiddp::Error on every rank when any rank's reads failed. Collective.
  void verdict();

 private:
  struct File;
  // The constructor's steps, in order (each collective, each failure agreed).
  void load_whole_file();
  void open_catalog();
  void verify_datasets();
  uint32_t crc_of_share(const std::string& name, const DatasetEntry& d);
  detail::Hid open_dataset(const std::string& name) const;
  void read_through_rank_zero(const std::string& name, const DatasetEntry* d, int64_t first, int64_t count,
                              torch::Tensor& out);
  MPI_Comm comm_;
  std::string path_;
  SnapshotIo io_;
  Snapshot meta_;
  std::map<std::string, DatasetEntry> datasets_;
  std::unique_ptr<File> file_;       ///< format 3: the open HDF5 file (rank 0 only without MPI-IO)
  std::unique_ptr<Snapshot> whole_;  ///< formats 1, 2: the file's tensors, on every rank
  LocalFailure failed_;              ///< this rank's first failed read
};

}  // namespace mpiddp::detail
