// What a training run is told (TrainerOptions) and what it reports of each epoch (EpochMetrics):
// plain data, read by the Trainer's phases in their rooms (the progress log, snapshots, the data).
// The rules they must meet are check_trainer_options() (trainer.hpp); the Trainer applies them.
#pragma once

#include <mpiddp/ddp.hpp>
#include <mpiddp/precision.hpp>
#include <mpiddp/zero.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>

namespace mpiddp {

/// Where a step stands, for learning-rate schedules.
struct StepInfo {
  int64_t global_step = 0;  ///< optimizer steps taken before this one, in all
  int64_t epoch = 0;        ///< 0-based
  int64_t total_steps = 0;  ///< steps the whole run will take
};
/// A learning-rate schedule: the factor applied to each parameter group's initial learning rate.
using LrSchedule = std::function<double(const StepInfo&)>;
/// loss(outputs, targets) -> scalar, the mean over the batch.
using LossFn = std::function<torch::Tensor(const torch::Tensor& outputs, const torch::Tensor& targets)>;
struct TrainerOptions {
  /// The training set: an HDF5 dataset file (see `mpiddp data`), or token shards as one stream
  /// (file names and globs, comma-separated, each glob in name order; see tokens.hpp).
  std::string data;
  std::string test_data;  ///< evaluated after each epoch and at the run's end ("" : none); same format
  /// auto (HDF5 for names ending .h5 or .hdf5, llm.c token shards otherwise) | hdf5 | llmc |
  /// raw-uint16 (nanoGPT's headerless train.bin: only when named, never guessed).
  std::string data_format = "auto";
  /// Token data: the tokens of a sample's input (windows of block_size + 1 at stride block_size).
  int64_t block_size = 0;
  /// Passes over the training set; 0: as many as max_steps takes (nanoGPT's max_iters), else 1.
  int64_t epochs = 0;
  int64_t max_steps = 0;    ///< stop after this many optimizer steps in all (0: no cap)
  int64_t batch_size = 64;  ///< per rank and micro-step
  /// Micro-steps per optimizer step: each rank runs grad_accum forward/backward passes of
  /// batch_size samples, each loss divided by grad_accum, gradients reduced across ranks only in
  /// the last (DDP's no_sync before); max_steps, snapshots and schedules count optimizer steps.
  int64_t grad_accum = 1;
  /// ZeRO (zero.hpp): 0 plain DDP; 1 each rank keeps the optimizer's state for its 1/N of the
  /// parameters only (gradients all-reduced, parameters all-gathered after the step); 2 also only
  /// its 1/N of the averaged gradient (buckets reduce-scattered during backward). The optimizer
  /// must be SGD, Adam or AdamW. 3: also only its 1/N of the model's units' parameters
  /// (Model::units(): the built-in GPT's embeddings, blocks and head, the MLP's and CNN's layers,
  /// SequentialUnits' picks), each unit gathered for its forward and its backward (units.hpp); a
  /// deferred model (units.hpp; `mpiddp train` builds the GPT so at stage 3) has no memory before
  /// fit(), which initialises it unit by unit, never whole on a rank; after fit() the model
  /// is whole again on every rank, or without memory where zero.whole_at_end is false (after a
  /// fit() that threw, the units' parameters are NaN). Each rank writes its own
  /// slices into the one snapshot file, which holds every tensor whole: a run resumes at any stage
  /// and rank count.
  /// The state lives in the shards during fit() and ends with it (gathering it whole on every rank
  /// would cost what stage 0 costs): after fit() the optimizer holds none; continue from a snapshot.
  int zero_stage = 0;
  /// Stage 3's gathering: prefetch, and whether a unit is freed between its forward and backward.
  ZeroOptions zero;
  /// The model's blocks run checkpointed (checkpoint.hpp): their activations are recomputed in
  /// backward instead of kept, for one more forward's time; results equal. The model must support
  /// it (Model::set_activation_checkpointing: the built-in GPT, SequentialUnits), else the Trainer throws.
  bool activation_checkpointing = false;
  /// fit() plans each rank's peak memory before its first step (Trainer::plan_memory: one probing
  /// forward and backward, training unchanged) and reports the measured peak after the first
  /// steps, both through on_note. false: neither.
  bool memory_plan = true;
  uint64_t seed = 0;  ///< the sampler's shuffle
  bool shuffle = true;
  bool drop_last = false;
  int64_t cache_bytes = int64_t{512} << 20;  ///< datasets up to this size are read into memory once
  /// Batches read ahead by a reader thread (BatchPrefetcher) while the current step computes; 0:
  /// each step reads its own batch (with a parallel HDF5 and an uncached set, one collective
  /// MPI-IO read per step). A cached set trained on the CPU is always read on the training thread
  /// (a slice of memory: cheaper than a hand-over). The reader holds HDF5 only between the
  /// Trainer's own HDF5 calls; fit()'s on_epoch runs with the reader paused, so it may use HDF5 too.
  int prefetch_batches = 2;
  c10::Device device = c10::kCPU;  ///< where the model trains (it is moved there)
  LossFn loss;                     ///< nullptr: default_loss(data)
  /// Train and evaluate on the loss the model computes itself (Model::forward_with_loss: a
  /// TorchScript forward(inputs, targets) returning (outputs, loss), as nanoGPT's GPT); `loss` unused.
  bool model_loss = false;
  LrSchedule lr_schedule;  ///< nullptr: the optimizer's learning rates stay as they are
  /// JSON lines (rank 0, appended): one per epoch ("kind": "epoch") and one per progress line
  /// ("kind": "log", the same numbers as the line). Opened by the constructor.
  std::string metrics_path;
  /// TensorBoard event files here (rank 0; see tensorboard.hpp), "" : none. Scalars train/loss,
  /// train/samples_per_s, train/lr at each progress line; epoch/train_loss, epoch/test_loss,
  /// epoch/test_accuracy, epoch/samples_per_s, epoch/seconds, epoch/lr after each epoch; where
  /// known, tokens_per_s, flops_per_s and mfu under both; the run's options (run_config) as text.
  /// x axis: the global step. Opened by the constructor.
  std::string tensorboard_dir;
  // Snapshots (see snapshot.hpp): written by rank 0, read by rank 0 and broadcast.
  std::string snapshot_dir;          ///< "" : no snapshots
  int64_t save_every = 1;            ///< epochs between snapshots (0: only at the end)
  int64_t save_every_steps = 0;      ///< steps between snapshots (0: none mid-epoch)
  int keep = 3;                      ///< snapshots kept in snapshot_dir (0: all)
  std::string resume = "auto";       ///< auto (newest valid in snapshot_dir) | never | a snapshot file
  bool skip_nonfinite_loss = false;  ///< NaN/Inf loss: skip that step's update (false: throw)
  /// > 0: before each update, scale the gradients so that their global L2 norm (over all
  /// parameters, as torch.nn.utils.clip_grad_norm_) is at most this. It applies to the averaged
  /// gradients DDP leaves on every rank, so every rank computes the same norm and scale.
  double clip_grad_norm = 0;
  /// Progress lines within an epoch, on rank 0 through fit()'s on_note (and to the metrics and
  /// TensorBoard files), one line per update (no
  /// carriage returns: fit for a Slurm log): every `log_every_steps` steps (-1: a tenth of an
  /// epoch) and every `log_every_seconds`, whichever comes first; 0 turns a trigger off. With the
  /// defaults, lines are at least `log_min_gap_seconds` apart, so tiny epochs do not flood the log.
  int64_t log_every_steps = -1;
  double log_every_seconds = 30;
  double log_min_gap_seconds = 2;
  /// kFloat (fp32), kBFloat16 (autocast, CPU and CUDA) or kHalf (autocast and dynamic loss
  /// scaling; CUDA, and CPU with libtorch 2.x). Forward and evaluation run under autocast; the loss
  /// is computed in float32; parameters, gradients and optimizer state stay float32. See precision.hpp.
  c10::ScalarType precision = c10::kFloat;
  GradScalerOptions loss_scaling;  ///< kHalf only
  /// Model FLOPs of one sample's forward and backward, for the records' FLOP/s and MFU (flops.hpp);
  /// 0: the model's own figure (Model::training_flops_per_sample: the built-in GPT's), if any.
  double flops_per_sample = 0;
  /// PyTorch's profiler (Kineto) over `profile_steps` steps from global step `profile_first_step`
  /// (counted as max_steps: after that many steps), a Chrome trace per rank (the host's operators;
  /// on CUDA each kernel and copy with its GPU time). "%r" in the path becomes the rank, else
  /// FILE.rank<r>.json (as the DDP timeline); "" : none. A trace that cannot be written is a warning.
  std::string profile_path;
  int64_t profile_first_step = 10;
  int64_t profile_steps = 3;
  bool stop_signals = true;  ///< SIGTERM/SIGUSR1 stop training at a step boundary (see above)
  std::string run_config;    ///< free text stored in snapshots as "config" (the CLI stores its options)
  /// Buckets, compression, timeline. Its reduction and mean tail are the Trainer's (zero_stage).
  DdpOptions ddp;

  /// Samples each rank takes per optimizer step.
  int64_t samples_per_step() const { return batch_size * grad_accum; }
};

struct EpochMetrics {
  int64_t epoch = 0;  ///< 1-based: the first epoch is epoch 1 everywhere mpiddp prints one
  int64_t steps = 0, global_step = 0;
  double train_loss = 0, test_loss = -1, test_accuracy = -1;  ///< -1: no test data / regression
  double samples_per_s = 0, seconds = 0, lr = 0;
  double tokens_per_s = 0;       ///< token data: samples_per_s x block_size (0 otherwise)
  double flops_per_s = 0;        ///< model FLOPs trained per second, all ranks (0: FLOPs per sample unknown)
  double mfu = 0;                ///< flops_per_s over the job's dense peak (flops.hpp; 0: peak unknown)
  double first_step_unix_s = 0;  ///< wall clock (Unix seconds) when this run's first step ended; first epoch only
  int64_t skipped_steps = 0;     ///< steps whose update was skipped for a NaN/Inf loss
  int64_t overflow_steps = 0;    ///< fp16: steps whose update loss scaling skipped (Inf/NaN gradients)
  double loss_scale = 0;         ///< fp16: the loss scale at the epoch's end (0: no loss scaling)
};

}  // namespace mpiddp
