// Trainer: epochs of DDP training over an HDF5 dataset, evaluation, LR schedule and metrics.
// `mpiddp train` is a thin CLI over it.
#pragma once

#include <mpiddp/data.hpp>
#include <mpiddp/ddp.hpp>
#include <mpiddp/runtime.hpp>

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mpiddp {

struct TrainConfig {
  std::string model = "cnn";  ///< linear | mlp | cnn
  std::string data, test_data;
  int64_t epochs = 1;
  int64_t max_steps = 0;      ///< stop after this many optimizer steps in all (0: no cap)
  int64_t batch_size = 64;    ///< per rank
  double lr = 0.01;
  std::string optimizer = "sgd";  ///< sgd | adam | adamw
  double momentum = 0.0;
  double weight_decay = 0.0;
  std::string schedule = "none";  ///< none | step | cosine
  int64_t step_size = 1;          ///< step schedule: epochs between decays
  double gamma = 0.1;             ///< step schedule: decay factor
  int64_t warmup_steps = 0;       ///< linear warmup from lr/warmup_steps
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;
  std::string device = "cpu";     ///< cpu | cuda
  std::string backend = "mpi";    ///< mpi | nccl | gloo
  int threads = 0;                ///< intra-op threads per rank; 0: the cores this rank owns
  std::string metrics_path;       ///< JSON lines, one per epoch (rank 0)
  int64_t cache_bytes = int64_t{512} << 20;  ///< datasets up to this size are read into memory once
  // Snapshots (see checkpoint.hpp): written by rank 0, read by rank 0 and broadcast.
  std::string snapshot_dir;       ///< "": no snapshots
  int64_t save_every = 1;         ///< epochs between snapshots (0: none at epoch ends)
  int64_t save_every_steps = 0;   ///< steps between snapshots (0: none mid-epoch)
  int keep = 3;                   ///< snapshots kept in snapshot_dir (0: all)
  std::string resume = "auto";    ///< auto (newest valid in snapshot_dir) | never | a snapshot file
  std::string on_nan = "stop";    ///< NaN/Inf loss: stop (an error naming the step) | skip (that step's update)
  DdpOptions ddp;
};

struct EpochMetrics {
  int64_t epoch = 0, steps = 0, global_step = 0;
  double train_loss = 0, test_loss = -1, test_accuracy = -1;  ///< -1: no test data / regression
  double samples_per_s = 0, seconds = 0, lr = 0;
  double first_step_unix_s = 0;  ///< wall clock (Unix seconds) when this run's first step ended; first epoch only
  int64_t skipped_steps = 0;     ///< steps whose update was skipped for a NaN/Inf loss (--on-nan skip)
};

/// How fit() ended.
struct FitResult {
  std::vector<EpochMetrics> epochs;
  int stop_signal = 0;          ///< SIGTERM/SIGUSR1 that stopped training early (0: it ran to the end)
  int64_t global_step = 0;      ///< optimizer steps taken in all, counting those before a resume
  std::string resumed_from;     ///< the snapshot this run started from ("" : a fresh start)
  std::string last_snapshot;    ///< the newest snapshot this run wrote ("" : none)
};

/// Builds a model for the dataset: linear = one Linear layer (the seeds' Linear(20, 1));
/// mlp = Flatten, Linear(in, 128), ReLU, Linear(128, 64), ReLU, Linear(64, out); cnn = PyTorch's
/// MNIST example network (needs [1, 28, 28] inputs and 10 classes).
torch::nn::Sequential make_model(const std::string& name, const DatasetInfo& data);

class Trainer {
 public:
  /// Checks the configuration and opens the datasets on this rank; throws mpiddp::Error with a
  /// one-line reason on bad input. Calls no collective (safe in a local phase).
  Trainer(const Runtime& runtime, TrainConfig config);
  ~Trainer();

  /// Trains (collective), resuming from a snapshot as config().resume says. `on_epoch` runs on
  /// every rank after each epoch; `lines` receives the text every rank reports
  /// ("[RANK r] Epoch e | Batchsize: b | Steps: s"), gathered in rank order on rank 0.
  /// SIGTERM or SIGUSR1 on any rank stops every rank at the same step boundary, after a snapshot
  /// when snapshot_dir is set. Failures the ranks agree on (bad snapshot, NaN loss, unwritable
  /// snapshot) throw mpiddp::AgreedError on every rank.
  FitResult fit(const std::function<void(const EpochMetrics&, const std::vector<std::string>&)>& on_epoch = nullptr,
                const std::function<void(const std::string&)>& on_note = nullptr);

  torch::nn::Sequential model() const { return model_; }
  const TrainConfig& config() const { return config_; }
  int threads() const { return threads_; }

 private:
  struct Progress;
  double lr_at(int64_t global_step, int64_t epoch, int64_t total_steps) const;
  std::string fingerprint() const;
  std::string config_json() const;
  std::optional<Progress> restore(torch::optim::Optimizer& opt,
                                  const std::function<void(const std::string&)>& note, std::string* from);
  std::string save(const torch::optim::Optimizer& opt, const Progress& p);
  std::pair<double, double> evaluate(ProcessGroup& pg);

  const Runtime& runtime_;
  TrainConfig config_;
  std::unique_ptr<H5Dataset> train_, test_;
  torch::nn::Sequential model_{nullptr};
  c10::Device device_{c10::kCPU};
  int threads_ = 1;
  int64_t steps_per_epoch_ = 0;
};

}  // namespace mpiddp
