// Datasets in HDF5 and the distributed sampler.
//
// Layout of an mpiddp dataset file:
//   /inputs   [N, ...]  float32, or uint8 with a float attribute "scale" (value = byte x scale)
//   /targets  [N]       int64 class labels (task "classification"), or
//             [N, k]    float32 (task "regression")
//   file attributes: "task" ("classification" | "regression"), "num_classes" (classification),
//                    "source" (free text: where the data came from)
// Ranks read only the rows their batches need, by hyperslab selection, so memory stays bounded
// by the batch, whatever the file's size. With a parallel HDF5, open_parallel() switches the file
// to the MPI-IO driver and read_collective() lets MPI-IO aggregate the ranks' reads of a step.
#pragma once

#include <mpi.h>
#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mpiddp {

struct DatasetInfo {
  std::string path;
  int64_t samples = 0;
  std::vector<int64_t> sample_shape;  ///< one input's shape (inputs' dims after the first)
  bool uint8_inputs = false;
  double scale = 1.0;  ///< for uint8 inputs
  bool classification = true;
  int64_t num_classes = 0;  ///< classification only
  int64_t target_dim = 0;   ///< regression only (k)
  /// Token windows (tokens.hpp): the positions of a sample, T; inputs and targets are int64 [n, T]
  /// token ids, the target at each position the next token (classification over the vocabulary,
  /// num_classes 0: the model's output width decides, and every token is checked against it).
  /// 0: one input and one target per sample.
  int64_t block_size = 0;
};

/// A batch as tensors: inputs float32 [n, ...]; targets int64 [n] or float32 [n, k].
struct Example {
  torch::Tensor inputs, targets;
};

/// What the Trainer trains and evaluates on: numbered samples, read in batches. The kinds are an
/// HDF5 dataset file (H5Dataset) and the windows of a token stream (TokenWindows, tokens.hpp).
class SampleSet {
 public:
  virtual ~SampleSet() = default;
  virtual const DatasetInfo& info() const = 0;
  int64_t size() const { return info().samples; }
  /// The samples at `indices` (any order, repeats allowed), as one batch in that order.
  virtual Example read(const std::vector<int64_t>& indices) const = 0;
  /// Samples [begin, begin + count).
  virtual Example read_range(int64_t begin, int64_t count) const = 0;
  /// Throws mpiddp::Error naming the first class label (or token) outside [0, num_classes).
  virtual void check_labels(int64_t num_classes) const = 0;
  /// Whether reads come from memory (cheap enough to do on the training thread).
  virtual bool cached() const = 0;
  /// Reads the whole set into memory when it takes at most `max_bytes` (a kind already in memory:
  /// nothing to do). Returns cached().
  virtual bool cache(int64_t /*max_bytes*/) { return cached(); }
  /// Switches to collective reads on `comm` where the kind has them (collective); see H5Dataset.
  virtual bool open_parallel(MPI_Comm /*comm*/) { return false; }
  /// read() as one collective read where open_parallel() switched to them, else read().
  virtual Example read_collective(const std::vector<int64_t>& indices) const { return read(indices); }
};

/// Read-only access to one dataset file. Opening validates the layout and throws mpiddp::Error
/// with a one-line reason (missing file or dataset, lengths that differ, an empty dataset,
/// unsupported dtypes or ranks).
class H5Dataset final : public SampleSet {
 public:
  explicit H5Dataset(const std::string& path);
  ~H5Dataset() override;
  H5Dataset(const H5Dataset&) = delete;
  H5Dataset& operator=(const H5Dataset&) = delete;

  const DatasetInfo& info() const override { return info_; }
  Example read(const std::vector<int64_t>& indices) const override;
  Example read_range(int64_t begin, int64_t count) const override;
  /// Scans the labels in bounded chunks.
  void check_labels(int64_t num_classes) const override;
  /// Bytes the dataset takes as stored (inputs and targets).
  int64_t stored_bytes() const;
  /// Loads the whole dataset into memory (inputs as stored: uint8 stays uint8) when it takes at
  /// most `max_bytes`; later reads index memory instead of the file. Returns whether it did.
  bool cache(int64_t max_bytes) override;
  bool cached() const override;
  /// Reopens the file through MPI-IO on `comm` (collective: every rank of `comm` calls it), when
  /// HDF5 is the parallel build and the dataset is not cached. Returns whether it did (the same on
  /// every rank); throws mpiddp::Error on every rank if any rank could not reopen the file.
  bool open_parallel(MPI_Comm comm) override;
  bool parallel() const;
  /// read() as one collective MPI-IO read: every rank of open_parallel()'s communicator calls it
  /// the same number of times, each with its own rows. Without open_parallel(), plain read().
  Example read_collective(const std::vector<int64_t>& indices) const override;

 private:
  struct Handles;
  Example read_rows(const std::vector<int64_t>& indices, bool collective) const;
  void open_datasets();

  DatasetInfo info_;
  std::unique_ptr<Handles> h_;
};

/// Writes a dataset file in the layout above (inputs float32 or uint8; targets int64 [N] or
/// float32 [N, k]). `scale` is stored for uint8 inputs; `num_classes` for int64 targets.
void write_dataset(const std::string& path, const torch::Tensor& inputs, const torch::Tensor& targets,
                   double scale = 1.0, int64_t num_classes = 0, const std::string& source = "");

/// PyTorch's DistributedSampler: each epoch, a permutation of [0, n) seeded by seed + epoch (or
/// the identity without shuffle), padded by repeating its start to a multiple of the world size
/// (or cut to one, with drop_last), of which rank r takes positions r, r + world, ... So every
/// rank gets the same number of samples and no collective waits on a short shard.
class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world_size, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  /// Samples per rank per epoch (the same on every rank).
  int64_t num_samples() const { return num_samples_; }
  /// This rank's indices for the current epoch, in order.
  std::vector<int64_t> indices() const;

 private:
  int64_t n_;
  int rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_ = 0;
};

/// Reads batches ahead of the training loop on a background thread: read(0), read(1), ...,
/// read(count - 1), in that order (one reader: the order is deterministic), at most `depth` batches
/// ahead of the consumer. next() returns them in the same order; when read(i) throws, the next()
/// that would have returned batch i rethrows that exception (batches before it are returned first).
/// depth 0 reads on the calling thread, inside next(). read() runs under a lock that pause() also
/// takes: hold pause()'s lock to use a library that is not thread-safe (HDF5 without its
/// thread-safe build) on the training thread while the reader waits. The reader thread blocks
/// asynchronous signals (SIGTERM, SIGUSR1, ... reach the training thread); the destructor stops it,
/// waiting for a read in progress, whether or not every batch was taken.
class BatchPrefetcher {
 public:
  BatchPrefetcher(std::function<Example(int64_t)> read, int64_t count, int depth);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  /// The next batch in order; throws read()'s exception for the batch it failed on, or
  /// mpiddp::Error once all `count` batches were taken.
  Example next();
  /// Holds the reader between two reads until the lock is released.
  std::unique_lock<std::mutex> pause() { return std::unique_lock<std::mutex>(io_); }
  int depth() const { return depth_; }
  int64_t taken() const { return taken_; }

 private:
  void run();

  std::function<Example(int64_t)> read_;
  const int64_t count_;
  const int depth_;
  int64_t taken_ = 0;
  std::mutex io_;  // held by read()
  std::mutex m_;   // guards what follows
  std::condition_variable cv_;
  std::deque<Example> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

/// Reads an IDX file (MNIST's format, gzip-compressed or not) into a uint8 tensor of its shape.
torch::Tensor read_idx(const std::string& path);

}  // namespace mpiddp
