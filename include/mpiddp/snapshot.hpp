// Snapshots: one HDF5 file each, readable with h5dump, h5ls and h5py.
//
// A Snapshot is a set of named tensors (each an HDF5 dataset; '/' in a name makes groups, e.g.
// "model/0.weight", "optimizer/0.weight/exp_avg", "rng/rank1") and root attributes (integers,
// reals, texts). Every file also carries "checksum_crc32": a CRC-32 (zlib) over every tensor's
// name, dtype, shape and bytes and every attribute, so a bit flip that HDF5 itself would not
// notice is still refused. What the trainer stores: docs/snapshots.md.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mpiddp {

struct Snapshot {
  std::map<std::string, torch::Tensor> tensors;  ///< CPU tensors; float32/64, bf16, f16, int32/64, uint8
  std::map<std::string, int64_t> ints;
  std::map<std::string, double> reals;
  std::map<std::string, std::string> texts;
};

/// Writes `snapshot` to `path` so that `path` is either its old self or the complete new file:
/// a temporary file in the same directory, flushed and fsynced, renamed over `path`, then the
/// directory fsynced. On any failure (unwritable directory, full disk) the temporary file is
/// removed, `path` is untouched and mpiddp::Error says why.
void write_snapshot(const std::string& path, const Snapshot& snapshot);

/// Reads and verifies a snapshot file; throws mpiddp::Error naming the file and the reason
/// (not HDF5, truncated, not an mpiddp snapshot, checksum mismatch).
Snapshot read_snapshot(const std::string& path);

/// The same from an in-memory copy of the file's bytes (`name` is used in messages).
Snapshot read_snapshot_image(const std::vector<char>& image, const std::string& name);

/// A file's bytes (to send a snapshot from one rank to the others).
std::vector<char> read_file_bytes(const std::string& path);

/// A directory of snapshots named "snapshot-step<global step, 10 digits>.h5" and a symbolic link
/// "latest.h5" that always names the newest complete one (replaced atomically after each write).
class SnapshotDir {
 public:
  explicit SnapshotDir(std::string dir);
  const std::string& dir() const { return dir_; }
  /// Creates the directory if needed and proves a file can be written there (removing what
  /// writes that never finished left behind); throws mpiddp::Error with a one-line reason otherwise.
  void ensure_writable() const;
  /// Writes `snapshot` as the one of `global_step`, points latest.h5 at it and deletes all
  /// but the newest `keep` snapshots (keep <= 0: keep all). Returns the file's path.
  std::string save(const Snapshot& snapshot, int64_t global_step, int keep) const;
  /// The path of the snapshot of `global_step`.
  std::string path_of(int64_t global_step) const;
  /// Points latest.h5 at `path` (a complete snapshot in this directory) and keeps the newest `keep`.
  void publish(const std::string& path, int keep) const;
  /// Snapshot files in the directory, newest (highest step) first.
  std::vector<std::string> list() const;

 private:
  std::string dir_;
};

}  // namespace mpiddp
