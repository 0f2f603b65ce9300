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
#include <mpiddp/trainer_options.hpp>
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
struct ResidentBeforeRun;
}  // namespace detail

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
/// Throws mpiddp::Error (one line) for a parameter out of its range (step_size > 0, gamma > 0,
/// warmup_steps >= 0, min_factor in [0, 1]), naming the field as `name` spells it (nullptr: its own
/// name; the CLI passes its flags'). The schedule functions below check theirs by it.
void check_lr_schedule_params(const LrScheduleParams& params,
                              const std::function<std::string(const std::string& field)>& name = nullptr);
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

/// torch's cross_entropy over class labels: outputs [n, classes] and targets [n], or per position
/// outputs [n, T, vocab] and targets [n, T] (a language model: the mean over all n*T positions,
/// targets of -1 ignored, as nanoGPT's loss).
LossFn cross_entropy_loss();
/// Mean squared error, the targets cast to the outputs' dtype.
LossFn mse_loss();
/// cross_entropy_loss() for class labels, mse_loss() for regression targets.
LossFn default_loss(const DatasetInfo& data);

/// How fit() ended.
struct FitResult {
  std::vector<EpochMetrics> epochs;
  int stop_signal = 0;        ///< SIGTERM/SIGUSR1 that stopped training early (0: it ran to the end)
  int64_t global_step = 0;    ///< optimizer steps taken in all, counting those before a resume
  std::string resumed_from;   ///< the snapshot this run started from ("" : a fresh start)
  std::string last_snapshot;  ///< the newest snapshot this run wrote ("" : none)
};

/// Throws mpiddp::Error (one line) for an option of `options` outside its range, naming the field as
/// `name` spells it (nullptr: "TrainerOptions::<field>"; the CLI passes its flags' names). On rank 0 a
/// resume file must exist (rank 0 reports it; every rank then opens it). The Trainer's constructor calls it.
void check_trainer_options(const TrainerOptions& options,
                           const std::function<std::string(const std::string& field)>& name = nullptr, int rank = 0);

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

  /// The predicted peak memory of each rank for this run, by part (memory_plan.hpp). Makes the
  /// run's communication and update as fit() does (ZeRO stage 3 initialises and shards a deferred
  /// model, units.hpp), runs one micro-batch's forward and backward to measure its activations,
  /// then drops them and puts back the random generator, the buffers, the gradients and the
  /// optimizer's state it moved: training is unchanged. Collective.
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
  /// The optimizer's state from it, once ZeRO (`zero`, or null) has sharded the optimizer, and the
  /// model's slices where its units are deferred (restore() left them). Collective.
  void restore_shards(detail::SnapshotReader& reader, ZeroOptimizer* zero);
  std::string save(const detail::RunPosition& p, const ZeroOptimizer* zero);
  /// The memory plan (train/memory_plan.hpp) of the run communicating through `ddp`, `before` taken
  /// before `ddp` was made. Collective.
  MemoryPlan planned(DistributedDataParallel& ddp, const detail::ResidentBeforeRun& before);
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
/// The data formats open_sample_set() takes (TrainerOptions::data_format), in order: auto, hdf5,
/// llmc, raw-uint16.
std::vector<std::string> data_format_names();
/// Throws mpiddp::Error "unknown <what> '<format>' (auto, hdf5, llmc, raw-uint16)" unless `format` is
/// one of data_format_names().
void check_data_format(const std::string& format, const std::string& what = "data format");

}  // namespace mpiddp
