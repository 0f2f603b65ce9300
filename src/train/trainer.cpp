// The Trainer: construction (every check that needs no other rank) and the training loop, fit(), as
// a sequence of phases, each in its own unit with its cross-rank contract:
//   BatchSource (batch_source.hpp)  the step's batch: cached slices, file reads, a reader thread
//   micro_steps (micro_steps.hpp)   forward and backward; the last backward reduces the gradients
//   StepAgreement                   stop signal and non-finite loss: one verdict for all ranks
//   Update (update.hpp)             fp16 unscale, clipping, the optimizer's step
//   ProgressLog (progress_log.hpp)  progress lines, metrics JSON, TensorBoard
//   SnapshotPolicy                  when to write a snapshot (trainer_snapshot.cpp writes it)
//   evaluate (evaluation.hpp)       the test set after each epoch
// Every forward and its loss go through ForwardLoss (forward_loss.hpp); the model is checked against
// the data by model_check.hpp. Option rules are in trainer_options.cpp, the task in task.cpp, losses in
// loss.cpp, schedules in lr_schedule.cpp.
#include <mpiddp/backends.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/memory.hpp>
#include <mpiddp/snapshot.hpp>
#include <mpiddp/trainer.hpp>
#include <mpiddp/zero.hpp>

#include <set>
#include <tuple>

#include "common/host.hpp"
#include "common/run_position.hpp"
#include "common/text.hpp"
#include "log/progress_log.hpp"
#include "snapshot/parallel_snapshot.hpp"
#include "snapshot/snapshot_policy.hpp"
#include "train/batch_source.hpp"
#include "train/epoch_clock.hpp"
#include "train/evaluation.hpp"
#include "train/forward_loss.hpp"
#include "train/memory_plan.hpp"
#include "train/micro_steps.hpp"
#include "train/model_check.hpp"
#include "train/step_agreement.hpp"
#include "train/step_profiler.hpp"
#include "train/stop_signals.hpp"
#include "train/task.hpp"
#include "train/update.hpp"
#include "zero/model_sharding.hpp"

namespace mpiddp {

using detail::RunPlan;
using detail::RunPosition;
using detail::shape_text;

// ---- construction: every check that needs no other rank ----------------------------------------

Trainer::Trainer(const Runtime& runtime, ProcessGroup& pg, std::shared_ptr<Model> model,
                 std::shared_ptr<torch::optim::Optimizer> optimizer, TrainerOptions options)
    : Trainer(
          runtime, pg,
          [&](const DatasetInfo&) {
            return ModelAndOptimizer{model, optimizer};
          },
          std::move(options)) {}

Trainer::Trainer(const Runtime& runtime, ProcessGroup& pg, const ModelFactory& make, TrainerOptions options)
    : runtime_(runtime), pg_(pg), options_(std::move(options)) {
  check_options();
  open_data();
  adopt(make(train_->info()));
  const auto& o = options_;
  steps_per_epoch_ = detail::sampler_for(*train_, o, runtime).num_samples() / o.samples_per_step();
  MPIDDP_CHECK(steps_per_epoch_ > 0,
               "fewer samples than ranks x batch: " + std::to_string(train_->info().samples) +
                   " samples cannot fill one batch of " + std::to_string(o.batch_size) +
                   (o.grad_accum > 1 ? " x " + std::to_string(o.grad_accum) + " micro-steps" : "") + " on each of " +
                   std::to_string(runtime.size()) + " ranks");
  throughput_ =
      std::make_unique<detail::Throughput>(detail::throughput_of(o, *model_, task_->tokens_per_sample(), runtime));
  // Rank 0's files, last: every check above has passed before anything is created (a deferred
  // model's check against the data waits for fit(), which shards it first).
  logs_ = std::make_unique<detail::RunLogs>(o, runtime.rank());
}

void Trainer::check_options() const {
  const auto& o = options_;
  check_trainer_options(o, nullptr, runtime_.rank());
  if (o.precision == c10::kHalf) check_grad_scaler(o.device, o.loss_scaling);
  check_backend(pg_.backend(), o.device, runtime_, "TrainerOptions::device " + o.device.str());
  MPIDDP_CHECK(pg_.size() == runtime_.size() && pg_.rank() == runtime_.rank(),
               "the Trainer's process group must span the runtime's ranks");
  // Rank 0 makes the directory; fit() checks that every rank sees it (every rank writes snapshots).
  if (!o.snapshot_dir.empty() && runtime_.rank() == 0) SnapshotDir(o.snapshot_dir).ensure_writable();
}

// The training set (opened once: the model factory reads its shape from it), its task, the
// default loss, and the test set, which must match it.
void Trainer::open_data() {
  const auto& o = options_;
  train_ = open_sample_set(o.data, o);
  train_->cache(o.cache_bytes);
  const auto& info = train_->info();
  task_ = detail::task_of(info);
  if (!options_.loss) options_.loss = task_->default_loss();
  if (o.test_data.empty()) return;
  test_ = open_sample_set(o.test_data, o);
  test_->cache(o.cache_bytes);
  const auto& t = test_->info();
  MPIDDP_CHECK(
      t.sample_shape == info.sample_shape && t.classification == info.classification && t.target_dim == info.target_dim,
      "test set '" + o.test_data + "' does not match the training set: inputs " + shape_text(t.sample_shape) + " vs " +
          shape_text(info.sample_shape));
}

// The model and its optimizer, checked against each other and the data, on the training device.
void Trainer::adopt(ModelAndOptimizer made) {
  model_ = std::move(made.model);
  optimizer_ = std::move(made.optimizer);
  MPIDDP_CHECK(model_ && optimizer_, "Trainer needs a model and an optimizer");
  // Every parameter the optimizer steps must be the model's (else DDP would not average it).
  std::set<const void*> mine;
  for (const auto& p : model_->named_parameters()) mine.insert(p.second.unsafeGetTensorImpl());
  for (const auto& g : optimizer_->param_groups()) {
    for (const auto& p : g.params()) {
      MPIDDP_CHECK(mine.count(p.unsafeGetTensorImpl()),
                   "the optimizer holds a tensor that is not a parameter of the model");
    }
    base_lrs_.push_back(g.options().get_lr());
  }
  model_->to(options_.device);
  model_->set_activation_checkpointing(options_.activation_checkpointing);
  // Held as its ZeRO stage holds it (a deferred model stays so where its units are sharded) and
  // checked against the data once it has values.
  sharding_ = std::make_unique<detail::ModelSharding>(*model_, options_.zero_stage, options_.zero);
  sharding_->adopt([this](bool collective) {
    detail::check_model_fits_data(forward_loss(), *task_, *train_, test_.get(), options_.batch_size, collective);
  });
}

// The plan of fit()'s run, its communication and update made as fit() makes them and dropped after
// (the generator its draws moved and the optimizer's state ZeRO took put back; a deferred model's
// units deferred again).
MemoryPlan Trainer::plan_memory() {
  const auto before_ddp = detail::resident_before_run(*model_);  // before the state's copy, as fit() takes it
  const detail::CpuGeneratorGuard rng;
  const detail::OptimizerStateGuard state(*optimizer_);
  sharding_->start_run();
  const auto planning = sharding_->for_planning();
  DistributedDataParallel ddp(model_->named_parameters(), model_->named_buffers(), pg_, ddp_options());
  detail::Update update(*optimizer_, trainable_parameters(*model_), options_, pg_, {}, ddp, *planning);
  planning->check_once_sharded();
  return planned(ddp, before_ddp);
}

MemoryPlan Trainer::planned(DistributedDataParallel& ddp, const detail::ResidentBeforeRun& before) {
  const detail::PlannedRun run{
      *model_, *sharding_, *optimizer_, options_, pg_, *train_, [f = forward_loss()](const Example& e) {
        return f(e.inputs, e.targets).second;
      }};
  return detail::plan_run(run, ddp, before);
}

DdpOptions Trainer::ddp_options() const {
  const auto& o = options_;
  DdpOptions ddp = o.ddp;
  ddp.mean_tail_values = detail::StepAgreement::kSlots;  // the agreement rides with the gradients
  ddp.reduction = zero_reduction(o.zero_stage, o.ddp.compression);
  ddp.compression.reset();  // the reduction's now
  sharding_->configure(ddp);
  return ddp;
}

Trainer::~Trainer() = default;

detail::ForwardLoss Trainer::forward_loss() const { return {*model_, options_}; }

void Trainer::set_lr(const StepInfo& at) {
  if (!options_.lr_schedule) return;
  const double f = options_.lr_schedule(at);
  auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size() && g < base_lrs_.size(); ++g) groups[g].options().set_lr(base_lrs_[g] * f);
}

double Trainer::current_lr() const {
  const auto& groups = optimizer_->param_groups();
  return groups.empty() ? 0.0 : groups.front().options().get_lr();
}

// ---- training ------------------------------------------------------------------------------------

// fit()'s phases, made in this order and ended in the reverse one (the Update last but DDP: at stage 3
// it hands the units back before DDP's hooks go).
struct Trainer::Run {
  Run(Trainer& t, const RunPlan& plan, int read_ahead)
      : plan(plan),
        before_ddp(detail::resident_before_run(*t.model_)),
        ddp(t.model_->named_parameters(), t.model_->named_buffers(), t.pg_, t.ddp_options()),
        agreement(ddp.mean_tail(), t.pg_),
        snapshots(t.options_),
        read_ahead(read_ahead) {}

  const RunPlan plan;
  const detail::ResidentBeforeRun before_ddp;  ///< the memory plan's process: the model made, nothing of the run's
  DistributedDataParallel ddp;
  detail::StepAgreement agreement;
  std::unique_ptr<detail::Update> update;        ///< once a resume has put the optimizer's state in place
  std::optional<detail::ProgressLog> progress;   ///< once every start-up check passed (rank 0's logs)
  std::unique_ptr<detail::BatchSource> batches;  ///< from the position the run starts at
  const detail::SnapshotPolicy snapshots;
  std::optional<detail::StepProfiler> profiler;
  const int read_ahead;
  std::optional<MemoryPlan> memory;
  int64_t steps_run = 0;    ///< by this fit(); the measured peak is reported after kMemoryCheckSteps
  int64_t saved_step = -1;  ///< the global step of the last snapshot after a step
  double first_step_unix_s = 0;
};

FitResult Trainer::fit(const std::function<void(const EpochMetrics&, const std::vector<std::string>&)>& on_epoch,
                       const Note& on_note) {
  const auto& o = options_;
  const Note note = [&](const std::string& text) {
    if (on_note && runtime_.rank() == 0) on_note(text);
  };
  detail::StopSignals stop_signals(o.stop_signals);
  FitResult result;
  RunPosition p;
  auto run = start(note, on_note, result, p);
  for (; run->plan.running(p); p = p.next_epoch()) {
    const RunPosition epoch_start = p;
    run->progress->start_epoch();
    detail::EpochClock clock;
    while (run->plan.epoch_running(p)) {
      const int stop_signal = step(*run, p, note);
      if (run->snapshots.after_step(p, stop_signal != 0)) {
        p.seconds += clock.lap();
        result.last_snapshot = write_snapshot(*run, p);
        run->saved_step = p.global_step;
        clock.restart();
      }
      if (stop_signal != 0) return stopped(result, p, stop_signal, note);
    }
    p.seconds += clock.lap();
    EpochMetrics m = finish_epoch(p, epoch_start, run->update->loss_scale(), *run->batches);
    if (result.epochs.empty()) m.first_step_unix_s = run->first_step_unix_s;  // this run's first epoch
    run->progress->on_epoch(m);
    result.epochs.push_back(m);
    if (on_epoch) {
      auto hold = run->batches->pause();  // the callback may use HDF5 too
      on_epoch(m, rank_lines(p));
    }
    // A run that --max-steps ends inside an epoch resumes there (unless that step's snapshot is
    // written already). Every rank decides alike: saved_step, not the path only rank 0 knows.
    const bool saved_here = run->saved_step == p.global_step;
    if (run->snapshots.after_epoch(p, run->plan.last_epoch(p)) && (run->plan.epoch_done(p) || !saved_here)) {
      result.last_snapshot = write_snapshot(*run, run->plan.epoch_done(p) ? p.next_epoch() : p);
    }
  }
  if (const auto written = run->profiler->finish(); !written.empty()) note("profile written: " + written);
  if (run->memory && run->steps_run > 0 && run->steps_run < kMemoryCheckSteps) {
    note(measured_memory(*run->memory, run->steps_run));
  }
  result.global_step = p.global_step;
  return result;
}

// The run's start: the snapshot it resumes from, the phases, the memory plan once the model is held
// as it trains (a deferred model's units initialised, or read, by ZeRO).
std::unique_ptr<Trainer::Run> Trainer::start(const Note& note, const Note& on_note, FitResult& result, RunPosition& p) {
  const auto& o = options_;
  const int read_ahead = detail::BatchSource::read_ahead(*train_, o, runtime_, note);
  if (detail::SnapshotPolicy(o).enabled()) detail::check_shared_directory(runtime_.world(), o.snapshot_dir);
  sharding_->start_run();
  auto resumed = restore(note, &result.resumed_from, p);
  auto run = std::make_unique<Run>(*this, RunPlan(o.epochs, steps_per_epoch_, o.max_steps), read_ahead);
  run->update = std::make_unique<detail::Update>(*optimizer_, trainable_parameters(*model_), o, pg_, p, run->ddp,
                                                 *sharding_, /*initialise_units=*/!resumed);
  if (resumed) restore_shards(*resumed, run->update->zero());  // under ZeRO each rank reads its slices
  resumed.reset();
  sharding_->check_once_sharded();
  std::optional<MemoryPlan> memory;
  if (o.memory_plan) {
    memory = planned(run->ddp, run->before_ddp);
    note(memory->describe());
  }
  if (memory) reset_peak_resident_bytes();  // the measured peak is training's
  run->memory = memory;
  run->progress.emplace(*logs_, o, runtime_, run->plan, p, *throughput_, on_note);
  run->batches = std::make_unique<detail::BatchSource>(*train_, o, runtime_, run->plan, p, run->read_ahead);
  run->profiler.emplace(o, runtime_.rank());
  model_->train(true);
  return run;
}

// One optimizer step: its micro-batches' forward and backward, the agreement's verdict, the update
// (or the step skipped), the progress line and the memory line.
int Trainer::step(Run& run, RunPosition& p, const Note& note) {
  const Example batch = run.batches->next();
  run.profiler->before_step(p.global_step);
  set_lr({p.global_step, p.epoch, run.plan.total_steps});
  p.lr = current_lr();
  const auto step_loss =
      detail::micro_steps(batch, options_.grad_accum, forward_loss(), run.ddp, run.agreement, *run.update);
  const auto verdict = run.agreement.settle();  // the step's one wait for the device
  const double loss = step_loss.item<double>();
  if (verdict.bad_rank >= 0) {
    skip_step(p, verdict.bad_rank, note);
    ++p.skipped;
  } else {
    if (!run.update->apply()) ++p.overflow;
    p.loss_sum += loss;  // an fp16 overflow's loss still counts: the forward was real
  }
  run.ddp.zero_grad();
  p.advance();
  if (const auto written = run.profiler->after_step(p.global_step); !written.empty())
    note("profile written: " + written);
  run.progress->on_step(p, loss, verdict.bad_rank >= 0);
  if (++run.steps_run == kMemoryCheckSteps && run.memory) note(measured_memory(*run.memory, run.steps_run));
  if (run.first_step_unix_s == 0) run.first_step_unix_s = detail::unix_seconds();
  return verdict.stop_signal;
}

std::string Trainer::write_snapshot(Run& run, const RunPosition& at) {
  auto hold = run.batches->pause();  // HDF5 is not thread-safe: the reader waits
  RunPosition position = at;
  run.update->save_state(position);
  return save(position, run.update->zero());
}

std::string Trainer::measured_memory(const MemoryPlan& plan, int64_t steps) const {
  return plan.against(allgather_int64(runtime_.world(), {peak_resident_bytes()}), steps);
}

FitResult Trainer::stopped(FitResult result, const RunPosition& p, int signal,
                           const std::function<void(const std::string&)>& note) const {
  detail::StopSignals::stopping(signal);  // this rank too is on its way out
  result.stop_signal = signal;
  result.global_step = p.global_step;
  note("stopped by " + std::string(detail::signal_name(signal)) + " at " + p.where() +
       (detail::SnapshotPolicy(options_).enabled()
            ? "; snapshot " + result.last_snapshot + " written: rerun with --resume auto to continue"
            : "; no snapshot directory, so nothing was saved"));
  return result;
}

void Trainer::skip_step(const RunPosition& p, int bad_rank, const std::function<void(const std::string&)>& note) {
  const std::string where = p.where();
  if (!options_.skip_nonfinite_loss) {
    MPIDDP_THROW_AGREED("loss is NaN or Inf at " + where + " on rank " + std::to_string(bad_rank) +
                        "; stopping (TrainerOptions::skip_nonfinite_loss, `--on-nan skip`, skips such steps instead)");
  }
  note("warning: loss is NaN or Inf at " + where + " on rank " + std::to_string(bad_rank) + "; update skipped");
}

// The epoch's numbers (collective: the mean training loss over the ranks, and the evaluation).
EpochMetrics Trainer::finish_epoch(const RunPosition& p, const RunPosition& epoch_start, double loss_scale,
                                   detail::BatchSource& batches) {
  const auto& o = options_;
  const int64_t taken = p.step_in_epoch - (p.skipped - epoch_start.skipped);
  EpochMetrics m;
  m.epoch = p.epoch + 1;
  m.steps = p.step_in_epoch;
  m.global_step = p.global_step;
  m.lr = p.lr;
  m.skipped_steps = p.skipped - epoch_start.skipped;
  m.overflow_steps = p.overflow - epoch_start.overflow;
  m.loss_scale = loss_scale;
  m.seconds = p.seconds;
  auto mean_loss =
      torch::tensor({taken > 0 ? p.loss_sum / static_cast<double>(taken) : 0.0}, torch::kDouble).to(o.device);
  pg_.allreduce(mean_loss, ReduceOp::kAvg);
  m.train_loss = mean_loss.cpu().item<double>();
  // The epoch's steps over its seconds, both counted from its start (a resumed epoch's too).
  m.samples_per_s =
      p.seconds > 0 ? static_cast<double>(p.step_in_epoch * o.samples_per_step() * runtime_.size()) / p.seconds : 0;
  const detail::Rates rates = throughput_->at(m.samples_per_s);
  m.tokens_per_s = rates.tokens_per_s;
  m.flops_per_s = rates.flops_per_s;
  m.mfu = rates.mfu;
  if (test_) {
    auto hold = batches.pause();
    std::tie(m.test_loss, m.test_accuracy) =
        detail::evaluate(*test_, *task_, forward_loss(), *sharding_, pg_, options_.batch_size);
  }
  return m;
}

// Every rank took the same steps of the same size (the per-step agreement keeps them in lockstep),
// so rank 0 writes every rank's line itself: no gather, one collective fewer.
std::vector<std::string> Trainer::rank_lines(const RunPosition& p) const {
  std::vector<std::string> lines;
  for (int r = 0; runtime_.rank() == 0 && r < runtime_.size(); ++r) {
    lines.push_back("[RANK " + std::to_string(r) + "] Epoch " + std::to_string(p.epoch + 1) + " | Batchsize: " +
                    std::to_string(options_.batch_size) + " | Steps: " + std::to_string(p.step_in_epoch));
  }
  return lines;
}

}  // namespace mpiddp
