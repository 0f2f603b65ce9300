// Trainer: data-parallel training of any mpiddp::Model (a C++ module or a TorchScript module) over
// HDF5 datasets, with the user's optimizer and loss, and everything `mpiddp train` has: snapshots
// with bitwise resume, stop signals, NaN/Inf agreement across ranks, learning-rate schedules,
// evaluation, metrics. `mpiddp train` is a client of this API.
//
// What the Trainer does to process-wide state, and nothing else:
//  - fit() installs handlers for SIGTERM and SIGUSR1 while it runs (TrainerOptions::stop_signals,
//    default on), so that Slurm's preemption signal stops every rank at one step boundary; the
//    previous handlers come back when fit() returns, unless such a signal came.
//  - Snapshots hold each rank's global CPU RNG state (and the CUDA one when training there), and
//    resuming restores it.
//  - It sets no seed and no thread count (torch::manual_seed, torch::set_num_threads are the
//    caller's) and touches the optimizer only through step(), its state (resume) and, with an
//    lr_schedule, its learning rates.
#pragma once

#include <mpiddp/data.hpp>
#include <mpiddp/ddp.hpp>
#include <mpiddp/memory_plan.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/precision.hpp>
#include <mpiddp/runtime.hpp>
#include <mpiddp/zero.hpp>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mpiddp {
class ZeroOptimizer;
namespace detail {
struct RunPosition;
class SnapshotReader;
struct RunLogs;
class BatchSource;
class StepAgreement;
class Task;
struct Throughput;
class Update;
class ModelSharding;
class ForwardLoss;
}  // namespace detail

/// Where a step stands, for learning-rate schedules.
struct StepInfo {
  int64_t global_step = 0;  ///< optimizer steps taken before this one, in all
  int64_t epoch = 0;        ///< 0-based
  int64_t total_steps = 0;  ///< steps the whole run will take
};
/// A learning-rate schedule: the factor applied to each parameter group's initial learning rate.
using LrSchedule = std::function<double(const StepInfo&)>;
/// x gamma every `step_size` epochs.
LrSchedule step_lr(int64_t step_size, double gamma);
/// nanoGPT's get_lr() as a factor of the base rate: a linear warmup (step + 1) / (warmup_steps + 1)
/// over the first warmup_steps, then cosine decay from 1 to min_factor over the rest of the run's
/// steps. cosine_lr() decays from 1 to 0 over the whole run.
LrSchedule cosine_lr(int64_t warmup_steps = 0, double min_factor = 0.0);
/// `schedule` (nullptr: constant) with a linear warmup from 1/warmup_steps over the first steps.
LrSchedule with_warmup(LrSchedule schedule, int64_t warmup_steps);

/// What a schedule made by name (lr_schedule_named) takes: `mpiddp train`'s --step-size, --gamma,
/// --warmup-steps and --min-lr / --lr.
struct LrScheduleParams {
  int64_t step_size = 1;     ///< "step": epochs between decays
  double gamma = 0.1;        ///< "step": the decay factor
  int64_t warmup_steps = 0;  ///< a linear warmup over this many steps (cosine's own, as nanoGPT's)
  double min_factor = 0.0;   ///< "cosine": the factor it decays to
};
/// The schedules by name, in order: none, step, cosine.
std::vector<std::string> lr_schedule_names();
/// Throws mpiddp::Error "unknown <what> '<name>' (none, step, cosine)" unless `name` is one of
/// lr_schedule_names().
void check_lr_schedule_name(const std::string& name, const std::string& what = "lr schedule");
/// The schedule called `name`: "none" (nullptr), "step" (step_lr) or "cosine" (cosine_lr, its
/// warmup included); the first two with_warmup where params.warmup_steps > 0. Throws as
/// check_lr_schedule_name, and as the schedule's own function on bad parameters.
LrSchedule lr_schedule_named(const std::string& name, const LrScheduleParams& params,
                             const std::string& what = "lr schedule");

/// loss(outputs, targets) -> scalar, the mean over the batch.
using LossFn = std::function<torch::Tensor(const torch::Tensor& outputs, const torch::Tensor& targets)>;
/// torch's cross_entropy over class labels: outputs [n, classes] and targets [n], or per position
/// outputs [n, T, vocab] and targets [n, T] (a language model: the mean over all n*T positions,
/// targets of -1 ignored, as nanoGPT's loss).
LossFn cross_entropy_loss();
/// Mean squared error, the targets cast to the outputs' dtype.
LossFn mse_loss();
/// cross_entropy_loss() for class labels, mse_loss() for regression targets.
LossFn default_loss(const DatasetInfo& data);

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
  /// Model FLOPs of one sample's forward and backward (flops.hpp), for the records' FLOP/s and
  /// MFU; 0: the model's own figure (Model::training_flops_per_sample: the built-in GPT's), if any.
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

  /// Throws mpiddp::Error (one line) for an option outside its range, naming the field as `name`
  /// spells it (nullptr: "TrainerOptions::<field>"; the CLI passes its flags' names). On rank 0 a
  /// resume file must exist (rank 0 reports it; every rank then opens it). The Trainer's constructor calls it.
  void validate(const std::function<std::string(const std::string& field)>& name = nullptr, int rank = 0) const;
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

/// How fit() ended.
struct FitResult {
  std::vector<EpochMetrics> epochs;
  int stop_signal = 0;        ///< SIGTERM/SIGUSR1 that stopped training early (0: it ran to the end)
  int64_t global_step = 0;    ///< optimizer steps taken in all, counting those before a resume
  std::string resumed_from;   ///< the snapshot this run started from ("" : a fresh start)
  std::string last_snapshot;  ///< the newest snapshot this run wrote ("" : none)
};

/// What a ModelFactory makes: the model and its optimizer (which must hold only the model's parameters).
struct ModelAndOptimizer {
  std::shared_ptr<Model> model;
  std::shared_ptr<torch::optim::Optimizer> optimizer;
};
/// Makes the model for the training set's shape (its inputs, classes or vocabulary), once the
/// Trainer has opened the set: the set is opened once, whoever needs its shape.
using ModelFactory = std::function<ModelAndOptimizer(const DatasetInfo& data)>;

class Trainer {
 public:
  /// Checks the options, opens the datasets and runs the model once on two samples (evaluation
  /// mode, no gradient: no state changes) to check its outputs against the targets (a deferred model
  /// at stage 3: fit() does, once it is initialised); throws mpiddp::Error with a one-line reason on
  /// bad input. Calls no collective. The optimizer must hold the model's parameters. A deferred model
  /// below stage 3 is initialised here (Model::materialise()).
  Trainer(const Runtime& runtime, ProcessGroup& pg, std::shared_ptr<Model> model,
          std::shared_ptr<torch::optim::Optimizer> optimizer, TrainerOptions options);
  /// The same, the model made by `make` from the training set once it is open (`mpiddp train`
  /// builds its model so).
  Trainer(const Runtime& runtime, ProcessGroup& pg, const ModelFactory& make, TrainerOptions options);
  ~Trainer();

  /// Trains (collective), resuming from a snapshot as options().resume says. `on_epoch` runs on
  /// every rank after each epoch; `lines` receives the text every rank reports
  /// ("[RANK r] Epoch e | Batchsize: b | Steps: s"), in rank order on rank 0 (empty elsewhere;
  /// rank 0 writes them: the ranks step in lockstep). `on_note`
  /// receives rank 0's notes (resumed from, skipped steps, stop). SIGTERM or SIGUSR1 on any rank
  /// stops every rank at the same step boundary, after a snapshot when snapshot_dir is set.
  /// Failures the ranks agree on (bad snapshot, NaN loss, unwritable snapshot) throw
  /// mpiddp::AgreedError on every rank.
  using Note = std::function<void(const std::string&)>;
  FitResult fit(const std::function<void(const EpochMetrics&, const std::vector<std::string>&)>& on_epoch = nullptr,
                const Note& on_note = nullptr);

  /// The predicted peak memory of each rank for this run, by part (memory_plan.hpp). Runs one
  /// micro-batch's forward and backward to measure its activations, then puts back the random
  /// generator, the buffers and the gradients it moved: training is unchanged. Local; collective
  /// for a deferred model (units.hpp), which ZeRO stage 3 initialises and shards for it as fit() does.
  MemoryPlan plan_memory();

  Model& model() { return *model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const TrainerOptions& options() const { return options_; }

 private:
  void check_options() const;
  void open_data();
  void adopt(ModelAndOptimizer made);
  std::string fingerprint() const;
  /// The snapshot the run resumes from, open on every rank, with the model (but its deferred
  /// parameters: restore_shards() reads their slices), RNG and position `p`
  /// loaded from it (nullptr: a fresh start). Collective.
  std::unique_ptr<detail::SnapshotReader> restore(const std::function<void(const std::string&)>& note,
                                                  std::string* from, detail::RunPosition& p);
  /// The optimizer's state from it, once ZeRO (`zero`, or null) has sharded the optimizer, and,
  /// `deferred`, the model's slices (restore() left them). Collective.
  void restore_shards(detail::SnapshotReader& reader, ZeroOptimizer* zero, bool deferred);
  std::string save(const detail::RunPosition& p, const ZeroOptimizer* zero);
  /// The model against the data (train/model_check.hpp). Local, but collective where `sharded`
  /// (stage 3 has sharded the model), its failure then agreed.
  void check_model_fits_data(bool sharded);
  /// The memory plan (train/memory_plan.hpp). `sharded`: the model is sharded over it (stage 3, a
  /// deferred model), the process's resident size taken before (`resident_before_sharding`).
  MemoryPlan planned(DistributedDataParallel* sharded = nullptr, int64_t resident_before_sharding = 0);
  DdpOptions ddp_options() const;  ///< fit()'s: the reduction of the ZeRO stage, stage 3's units
  /// The largest rank's measured peak against the plan, one line. Collective.
  std::string measured_memory(const MemoryPlan& plan, int64_t steps) const;
  /// Steps after which fit() reports the measured peak (the optimizer's state exists from the first).
  static constexpr int64_t kMemoryCheckSteps = 3;
  /// The model's forward and loss under the options' precision (train/forward_loss.hpp).
  detail::ForwardLoss forward_loss() const;
  void set_lr(const StepInfo& at);
  double current_lr() const;
  struct Run;  ///< fit()'s phases (trainer.cpp)
  std::unique_ptr<Run> start(const Note& note, const Note& on_note, FitResult& result, detail::RunPosition& p);
  /// One optimizer step (StepAgreement's verdict, the update, the progress line); returns the stop
  /// signal the ranks agreed on (0: none).
  int step(Run& run, detail::RunPosition& p, const Note& note);
  std::string write_snapshot(Run& run, const detail::RunPosition& at);
  void skip_step(const detail::RunPosition& p, int bad_rank, const std::function<void(const std::string&)>& note);
  FitResult stopped(FitResult result, const detail::RunPosition& p, int signal,
                    const std::function<void(const std::string&)>& note) const;
  EpochMetrics finish_epoch(const detail::RunPosition& p, const detail::RunPosition& epoch_start, double loss_scale,
                            detail::BatchSource& batches);
  std::vector<std::string> rank_lines(const detail::RunPosition& p) const;

  const Runtime& runtime_;
  ProcessGroup& pg_;
  std::shared_ptr<Model> model_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  TrainerOptions options_;
  std::unique_ptr<SampleSet> train_, test_;
  std::unique_ptr<detail::Task> task_;  ///< what the training set asks of the model
  std::unique_ptr<detail::ModelSharding>
      sharding_;                  ///< how the ranks hold the model's parameters (ZeRO stage 3: its units sharded)
  std::vector<double> base_lrs_;  ///< each parameter group's learning rate when the Trainer was made
  int64_t steps_per_epoch_ = 0;
  std::unique_ptr<detail::RunLogs> logs_;           ///< rank 0's metrics file and TensorBoard writer
  std::unique_ptr<detail::Throughput> throughput_;  ///< what samples/s makes tokens/s, FLOP/s and MFU with
};

/// The training or test set that `source` names, as the Trainer opens it (options.data_format,
/// options.block_size), not yet cached (the Trainer calls cache(options.cache_bytes)). Throws
/// mpiddp::Error naming the file for a missing or malformed one.
std::unique_ptr<SampleSet> open_sample_set(const std::string& source, const TrainerOptions& options);

}  // namespace mpiddp
