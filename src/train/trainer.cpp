// The Trainer: construction (every check that needs no other rank), evaluation and the training
// loop. Snapshots are in trainer_snapshot.cpp, schedules in schedule.cpp.
#include <mpiddp/checkpoint.hpp>
#include <mpiddp/compat.hpp>
#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/tensorboard.hpp>
#include <mpiddp/trainer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/host.hpp"
#include "common/text.hpp"
#include "train/progress.hpp"
#include "train/stop_signals.hpp"

namespace mpiddp {

using detail::first_line;
using detail::shape_text;

namespace {

int64_t flat_size(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// "1:02:03" or "4:05" for a duration in seconds.
std::string clock_text(double seconds) {
  const auto total = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", total / 60, total % 60);
  }
  return text;
}

// The run's options as TensorBoard text: a Markdown table of a JSON object (what the CLI stores),
// else the text as it is.
std::string options_markdown(const std::string& config) {
  const auto j = nlohmann::json::parse(config, nullptr, false);
  if (!j.is_object()) return config;
  std::string text = "| option | value |\n|---|---|\n";
  for (const auto& [key, value] : j.items()) {
    text += "| " + key + " | " + (value.is_string() ? value.get<std::string>() : value.dump()) + " |\n";
  }
  return text;
}

}  // namespace

// Rank 0's outputs besides on_epoch/on_note: the JSON-lines metrics and the TensorBoard events.
struct Trainer::Logs {
  std::ofstream metrics;
  std::unique_ptr<SummaryWriter> tensorboard;

  void line(const nlohmann::json& j) {
    if (metrics.is_open()) metrics << j.dump() << std::endl;
  }
  void scalar(const std::string& tag, double value, int64_t step) {
    if (tensorboard) tensorboard->add_scalar(tag, value, step);
  }
};

// ---- construction: every check that needs no other rank ----------------------------------------

Trainer::Trainer(const Runtime& runtime, ProcessGroup& pg, std::shared_ptr<Model> model,
                 std::shared_ptr<torch::optim::Optimizer> optimizer, TrainerOptions options)
    : runtime_(runtime), pg_(pg), model_(std::move(model)), optimizer_(std::move(optimizer)),
      options_(std::move(options)) {
  const auto& o = options_;
  MPIDDP_CHECK(model_ && optimizer_, "Trainer needs a model and an optimizer");
  MPIDDP_CHECK(o.epochs > 0, "TrainerOptions::epochs must be > 0, got " + std::to_string(o.epochs));
  MPIDDP_CHECK(o.batch_size > 0, "TrainerOptions::batch_size must be > 0, got " + std::to_string(o.batch_size));
  MPIDDP_CHECK(o.log_every_steps >= -1 && o.log_every_seconds >= 0 && o.log_min_gap_seconds >= 0,
               "TrainerOptions::log_every_steps must be >= -1 and log_every_seconds, log_min_gap_seconds >= 0");
  MPIDDP_CHECK(o.clip_grad_norm >= 0 && std::isfinite(o.clip_grad_norm),
               "TrainerOptions::clip_grad_norm must be >= 0 (0: no clipping), got " + std::to_string(o.clip_grad_norm));
  MPIDDP_CHECK(o.max_steps >= 0, "TrainerOptions::max_steps must be >= 0");
  MPIDDP_CHECK(o.precision == c10::kFloat || o.precision == c10::kBFloat16 || o.precision == c10::kHalf,
               "TrainerOptions::precision must be kFloat, kBFloat16 or kHalf, got " +
                   std::string(c10::toString(o.precision)));
  if (o.precision == c10::kHalf) [[maybe_unused]] GradScaler check(o.device, o.loss_scaling);  // throws where it cannot
  MPIDDP_CHECK(o.save_every >= 0 && o.save_every_steps >= 0, "TrainerOptions::save_every(_steps) must be >= 0");
  MPIDDP_CHECK(o.keep >= 0, "TrainerOptions::keep must be >= 0");
  MPIDDP_CHECK(o.cache_bytes >= 0, "TrainerOptions::cache_bytes must be >= 0");
  MPIDDP_CHECK(o.prefetch_batches >= 0, "TrainerOptions::prefetch_batches must be >= 0 (0: no reader thread)");
  MPIDDP_CHECK(!o.resume.empty(), "TrainerOptions::resume takes auto, never or a snapshot file");
  MPIDDP_CHECK(!o.data.empty(), "TrainerOptions::data (the training set) is required");
  if (o.device.is_cuda()) {
    MPIDDP_CHECK(torch::cuda::is_available(), "device cuda: this libtorch has no CUDA or no GPU is visible");
  }
  MPIDDP_CHECK(pg_.size() == runtime.size() && pg_.rank() == runtime.rank(),
               "the Trainer's process group must span the runtime's ranks");
  if (o.resume != "auto" && o.resume != "never" && runtime.rank() == 0) {
    MPIDDP_CHECK(std::filesystem::exists(o.resume), "snapshot '" + o.resume + "' to resume from does not exist");
  }
  // Only rank 0 writes snapshots: it alone needs the directory.
  if (!o.snapshot_dir.empty() && runtime.rank() == 0) SnapshotDir(o.snapshot_dir).ensure_writable();
  // Every parameter the optimizer steps must be the model's (else DDP would not average it).
  {
    std::set<const void*> mine;
    for (const auto& p : model_->named_parameters()) mine.insert(p.second.unsafeGetTensorImpl());
    for (const auto& g : optimizer_->param_groups()) {
      for (const auto& p : g.params()) {
        MPIDDP_CHECK(mine.count(p.unsafeGetTensorImpl()), "the optimizer holds a tensor that is not a parameter of the model");
      }
      base_lrs_.push_back(g.options().get_lr());
    }
  }

  train_ = std::make_unique<H5Dataset>(o.data);
  train_->cache(o.cache_bytes);
  const auto& info = train_->info();
  if (!options_.loss) options_.loss = default_loss(info);
  if (!o.test_data.empty()) {
    test_ = std::make_unique<H5Dataset>(o.test_data);
    test_->cache(o.cache_bytes);
    const auto& t = test_->info();
    MPIDDP_CHECK(t.sample_shape == info.sample_shape && t.classification == info.classification &&
                     t.target_dim == info.target_dim,
                 "test set '" + o.test_data + "' does not match the training set: inputs " +
                     shape_text(t.sample_shape) + " vs " + shape_text(info.sample_shape));
  }
  model_->to(o.device);

  // One forward on two samples, in evaluation mode without gradients (no buffer, no RNG changes):
  // the model takes these inputs, and its outputs fit the targets.
  {
    torch::NoGradGuard no_grad;
    const auto probe = train_->read_range(0, std::min<int64_t>(2, train_->size()));
    torch::Tensor out;
    struct BackToTraining {
      Model& model;
      ~BackToTraining() { model.train(true); }
    } back{*model_};
    model_->train(false);
    try {
      Autocast autocast(o.device, o.precision);
      out = model_->forward(probe.inputs.to(o.device));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      MPIDDP_THROW("the model (" + model_->description() + ") fails on inputs of " +
                   shape_text(probe.inputs.sizes()) + ": " + first_line(e.what()));
    }
    const int64_t n = probe.inputs.size(0);
    if (info.classification) {
      MPIDDP_CHECK(out.dim() == 2 && out.size(0) == n,
                   "the model's outputs for " + std::to_string(n) + " samples are " + shape_text(out.sizes()) +
                       "; class labels need [" + std::to_string(n) + ", classes]");
      train_->check_labels(out.size(1));
      if (test_) test_->check_labels(out.size(1));
    } else {
      MPIDDP_CHECK(out.sizes() == probe.targets.sizes(),
                   "the model's outputs for " + std::to_string(n) + " samples are " + shape_text(out.sizes()) +
                       " but the targets are " + shape_text(probe.targets.sizes()));
    }
  }

  DistributedSampler sampler(info.samples, runtime.rank(), runtime.size(), o.shuffle, o.seed, o.drop_last);
  steps_per_epoch_ = sampler.num_samples() / o.batch_size;
  MPIDDP_CHECK(steps_per_epoch_ > 0, "fewer samples than ranks x batch: " + std::to_string(info.samples) +
                                         " samples cannot fill one batch of " + std::to_string(o.batch_size) +
                                         " on each of " + std::to_string(runtime.size()) + " ranks");
  // Rank 0's files, last: every check above has passed before anything is created.
  logs_ = std::make_unique<Logs>();
  if (runtime.rank() == 0 && !o.metrics_path.empty()) {
    logs_->metrics.open(o.metrics_path, std::ios::app);
    MPIDDP_CHECK(logs_->metrics.good(), "cannot write the metrics file '" + o.metrics_path + "'");
  }
  if (runtime.rank() == 0 && !o.tensorboard_dir.empty()) {
    logs_->tensorboard = std::make_unique<SummaryWriter>(o.tensorboard_dir);
  }
}

Trainer::~Trainer() = default;

const DatasetInfo& Trainer::data_info() const { return train_->info(); }

torch::Tensor Trainer::forward(const torch::Tensor& inputs) {
  torch::Tensor out;
  {
    Autocast autocast(options_.device, options_.precision);
    out = model_->forward(inputs);
  }
  // The loss (the caller's function) sees float32 outputs, whatever autocast ran in.
  if (options_.precision != c10::kFloat && out.is_floating_point() && out.scalar_type() != c10::kFloat) {
    out = out.to(c10::kFloat);
  }
  return out;
}

void Trainer::set_lr(const StepInfo& at) {
  if (!options_.lr_schedule) return;
  const double f = options_.lr_schedule(at);
  auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size() && g < base_lrs_.size(); ++g) groups[g].options().set_lr(base_lrs_[g] * f);
}

std::pair<double, double> Trainer::evaluate() {
  // Each rank scores a contiguous slice of the test set (no padding: every sample counts once);
  // the sums are all-reduced. The loss is the training loss (a mean) times each batch's size.
  torch::NoGradGuard no_grad;
  model_->train(false);
  const auto device = options_.device;
  const int64_t n = test_->size(), r = runtime_.rank(), w = runtime_.size();
  const int64_t begin = n * r / w, end = n * (r + 1) / w;
  double loss_sum = 0, correct = 0;
  constexpr int64_t kEvalBatch = 1000;
  for (int64_t b = begin; b < end; b += kEvalBatch) {
    auto e = test_->read_range(b, std::min(kEvalBatch, end - b));
    auto out = forward(e.inputs.to(device));
    auto y = e.targets.to(device);
    loss_sum += options_.loss(out, y).item<double>() * static_cast<double>(y.size(0));
    if (train_->info().classification) correct += out.argmax(1).eq(y).sum().item<double>();
  }
  auto sums = torch::tensor({loss_sum, correct}, torch::kDouble).to(device);
  pg_.allreduce(sums);
  sums = sums.cpu();
  model_->train(true);
  const double total = static_cast<double>(n);
  return {sums[0].item<double>() / total,
          train_->info().classification ? sums[1].item<double>() / total : -1.0};
}

// ---- snapshots ---------------------------------------------------------------------------------
// ---- training ------------------------------------------------------------------------------------

FitResult Trainer::fit(const std::function<void(const EpochMetrics&, const std::vector<std::string>&)>& on_epoch,
                       const std::function<void(const std::string&)>& on_note) {
  const auto& o = options_;
  const auto device = o.device;
  auto note = [&](const std::string& text) {
    if (on_note && runtime_.rank() == 0) on_note(text);
  };
  detail::StopSignals stop_signals(o.stop_signals);
  // A training set too large to cache is read batch by batch. Without prefetching, with a parallel
  // HDF5, each step's reads are one collective MPI-IO read (every rank takes the same number of
  // steps); the reader thread reads on its own (POSIX I/O), as collective calls belong to this thread.
  // A cached training set on the CPU is read on the training thread whatever --prefetch says: a
  // step then only slices a block gathered once per 8 MiB, and handing each slice over from a
  // reader thread cost more than it (12-15 us per step of the toy at 2 ranks on 2 cores).
  const int depth = train_->cached() && device.is_cpu() ? 0 : o.prefetch_batches;
  if (depth == 0 && train_->open_parallel(runtime_.world())) {
    note("data: '" + o.data + "' is larger than the cache limit: read per batch, one collective MPI-IO read per step");
  } else if (!train_->cached()) {
    note("data: '" + o.data + "' is larger than the cache limit: read per batch" +
         (depth > 0 ? ", " + std::to_string(depth) + " batch(es) ahead by a reader thread" : std::string()));
  }
  FitResult result;
  Progress p = restore(note, &result.resumed_from).value_or(Progress{});
  // Per step, every rank learns whether any rank has a stop signal pending or a loss that is not
  // finite: all ranks then take the same branch at the same step. The two counts ride in the last
  // gradient bucket's all-reduce (no collective of their own); only when one is set does a second
  // all-reduce (max) name the signal and the highest rank with a bad loss.
  DdpOptions ddp_options = o.ddp;
  ddp_options.extra_values = 2;
  DistributedDataParallel ddp(model_->named_parameters(), model_->named_buffers(), pg_, ddp_options);
  const torch::Tensor agreement = ddp.extras();  // [ranks stopping, ranks with a bad loss] / size
  // Written and read through a CPU float32 tensor: the extras themselves when they are one (no
  // operator call per step), else a copy.
  const bool direct = agreement.is_cpu() && agreement.scalar_type() == torch::kFloat;
  const torch::Tensor staging = direct ? agreement : torch::zeros({2}, torch::kFloat);
  float* const agree = staging.data_ptr<float>();

  auto& logs = *logs_;
  std::optional<GradScaler> scaler;  // fp16: dynamic loss scaling, continued from the snapshot
  if (o.precision == c10::kHalf) {
    scaler.emplace(device, o.loss_scaling);
    if (p.loss_scale > 0) scaler->load(p.loss_scale, p.growth_tracker);
  }
  auto with_scaler_state = [&](Progress q) {
    if (scaler) {
      q.loss_scale = scaler->scale_value();
      q.growth_tracker = scaler->growth_tracker();
    }
    return q;
  };
  if (logs.tensorboard) {
    if (p.global_step > 0) logs.tensorboard->add_session_start(p.global_step);  // a resumed run repeats steps
    logs.tensorboard->add_text("options", options_markdown(o.run_config.empty() ? "(TrainerOptions::run_config not set)"
                                                                                : o.run_config),
                               p.global_step);
  }
  const bool snapshots = !o.snapshot_dir.empty();
  const int64_t total_steps =
      o.max_steps > 0 ? std::min(o.max_steps, o.epochs * steps_per_epoch_) : o.epochs * steps_per_epoch_;
  double first_step_unix_s = 0;
  // The batches of the rest of the run, in the loop's order (epoch by epoch, the sampler's order
  // within each), read by a BatchPrefetcher `depth` steps ahead. A cached training set is gathered
  // a block of steps at a time (one gather of up to 8 MiB of float inputs) and each step takes a
  // slice of the block: the same rows, one gather instead of one per step. Otherwise every step
  // reads its own rows (collectively when parallel). The reader's state is its own: only one
  // thread calls it.
  const int64_t first_position = p.epoch * steps_per_epoch_ + p.step_in_epoch, first_global = p.global_step;
  const int64_t batches_left =
      std::max<int64_t>(0, std::min(total_steps - p.global_step, o.epochs * steps_per_epoch_ - first_position));
  const int64_t sample_floats = std::max<int64_t>(1, flat_size(train_->info().sample_shape));
  const int64_t block_steps = std::max<int64_t>(1, (int64_t{8} << 20) / (4 * sample_floats * o.batch_size));
  struct Reader {
    explicit Reader(DistributedSampler s) : sampler(std::move(s)) {}
    DistributedSampler sampler;
    std::vector<int64_t> indices;
    Example block;
    int64_t epoch = -1, block_first = -1;
  };
  auto reader = std::make_shared<Reader>(
      DistributedSampler(train_->size(), runtime_.rank(), runtime_.size(), o.shuffle, o.seed, o.drop_last));
  auto read_batch = [this, reader, first_position, first_global, block_steps](int64_t i) -> Example {
    const auto& o = options_;
    Reader& r = *reader;
    const int64_t epoch = (first_position + i) / steps_per_epoch_, s = (first_position + i) % steps_per_epoch_;
    try {
      if (epoch != r.epoch) {
        r.sampler.set_epoch(epoch);
        r.indices = r.sampler.indices();
        r.epoch = epoch;
        r.block_first = -1;
      }
      const auto at = [&](int64_t step) { return r.indices.begin() + step * o.batch_size; };
      Example e;
      if (!train_->cached()) {
        e = train_->read_collective(std::vector<int64_t>(at(s), at(s + 1)));
      } else {
        if (r.block_first < 0 || s >= r.block_first + block_steps) {  // steps only rise within an epoch
          const int64_t last = std::min(steps_per_epoch_, s + block_steps);
          r.block = train_->read(std::vector<int64_t>(at(s), at(last)));
          r.block_first = s;
        }
        const int64_t row = (s - r.block_first) * o.batch_size;
        e = {r.block.inputs.narrow(0, row, o.batch_size), r.block.targets.narrow(0, row, o.batch_size)};
      }
      if (o.device.is_cuda()) {  // page-locked: the copy to the GPU can overlap the step
        e.inputs = e.inputs.pin_memory();
        e.targets = e.targets.pin_memory();
      }
      return e;
    } catch (const std::exception& error) {
      MPIDDP_THROW("cannot read the batch of global step " + std::to_string(first_global + i) + " (epoch " +
                   std::to_string(epoch + 1) + ", step " + std::to_string(s) + ") from '" + o.data +
                   "': " + detail::reason_of(error));
    }
  };
  BatchPrefetcher batches(read_batch, batches_left, depth);
  auto current_lr = [&] {
    const auto& groups = optimizer_->param_groups();
    return groups.empty() ? 0.0 : groups.front().options().get_lr();
  };
  std::vector<torch::Tensor> clip_params;  // what clipping scales: the trainable parameters
  for (const auto& [name, param] : model_->named_parameters()) {
    if (param.requires_grad()) clip_params.push_back(param);
  }
  // Progress lines (rank 0): a window of steps since the last line.
  const bool log_rank = runtime_.rank() == 0 && (on_note || logs.metrics.is_open() || logs.tensorboard);
  const int64_t log_steps = o.log_every_steps < 0 ? std::max<int64_t>(1, steps_per_epoch_ / 10) : o.log_every_steps;
  struct Window {
    int64_t steps = 0;
    double loss = 0;
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  } window;
  model_->train(true);
  for (; p.epoch < o.epochs && p.global_step < total_steps; ++p.epoch, p.step_in_epoch = 0, p.loss_sum = 0,
                                                                p.seconds = 0) {
    window = Window{};  // each epoch's lines start afresh (evaluation is not training time)
    const int64_t first = p.step_in_epoch, skipped_before = p.skipped, overflow_before = p.overflow;
    auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    while (p.step_in_epoch < steps_per_epoch_ && p.global_step < total_steps) {
      const int64_t s = p.step_in_epoch;
      const Example e = batches.next();
      set_lr({p.global_step, p.epoch, total_steps});
      p.lr = current_lr();
      auto out = forward(device.is_cpu() ? e.inputs : e.inputs.to(device, /*non_blocking=*/true));
      auto loss = o.loss(out, device.is_cpu() ? e.targets : e.targets.to(device, /*non_blocking=*/true));
      const double loss_value = loss.item<double>();
      const int pending_signal = detail::StopSignals::pending();
      const bool finite = std::isfinite(loss_value);
      agree[0] = pending_signal != 0 ? 1.0F : 0.0F;
      agree[1] = finite ? 0.0F : 1.0F;
      if (!direct) agreement.copy_(staging);
      ddp.backward(scaler ? scaler->scale(loss) : loss);
      if (!direct) staging.copy_(agreement);
      int64_t stop = 0, bad_rank = -1;
      if (agree[0] > 0 || agree[1] > 0) {  // rare: which signal, which rank
        auto flags = torch::tensor({static_cast<int64_t>(pending_signal), finite ? int64_t{0} : runtime_.rank() + 1},
                                   torch::kLong)
                         .to(device);
        pg_.allreduce(flags, ReduceOp::kMax);
        flags = flags.cpu();
        stop = flags[0].item<int64_t>();
        bad_rank = flags[1].item<int64_t>() - 1;
      }
      if (bad_rank >= 0) {
        const std::string where = "global step " + std::to_string(p.global_step) + " (epoch " +
                                  std::to_string(p.epoch + 1) + ", step " + std::to_string(s) + ")";
        if (!o.skip_nonfinite_loss) {
          MPIDDP_THROW_AGREED("loss is NaN or Inf at " + where + " on rank " + std::to_string(bad_rank) +
                              "; stopping (TrainerOptions::skip_nonfinite_loss, `--on-nan skip`, skips such steps instead)");
        }
        note("warning: loss is NaN or Inf at " + where + " on rank " + std::to_string(bad_rank) +
             "; update skipped");
        ++p.skipped;
      } else {
        // fp16: the averaged gradients are unscaled and checked; a step with an Inf/NaN gradient
        // on any rank is skipped everywhere (its loss still counts: the forward was real).
        const bool overflow = scaler && scaler->unscale(clip_params, &pg_);
        if (!overflow) {
          if (o.clip_grad_norm > 0) torch::nn::utils::clip_grad_norm_(clip_params, o.clip_grad_norm);
          optimizer_->step();
        } else {
          ++p.overflow;
        }
        if (scaler) scaler->update();
        p.loss_sum += loss_value;
      }
      ddp.zero_grad();
      ++p.step_in_epoch;
      ++p.global_step;
      if (log_rank) {
        ++window.steps;
        window.loss += bad_rank >= 0 ? 0.0 : loss_value;
        const auto now = std::chrono::steady_clock::now();
        const double span = std::chrono::duration<double>(now - window.since).count();
        const bool by_steps = log_steps > 0 && p.step_in_epoch % log_steps == 0;
        const bool by_time = o.log_every_seconds > 0 && span >= o.log_every_seconds;
        if ((by_steps || by_time) && span >= o.log_min_gap_seconds && p.step_in_epoch < steps_per_epoch_ &&
            p.global_step < total_steps) {
          const double rate = static_cast<double>(window.steps) / std::max(span, 1e-9);  // steps/s
          const double samples_per_s = rate * static_cast<double>(o.batch_size * runtime_.size());
          const double loss_mean = window.loss / static_cast<double>(window.steps);
          const int64_t left_in_epoch = steps_per_epoch_ - p.step_in_epoch, left = total_steps - p.global_step;
          if (on_note) {
            char text[256];
            std::snprintf(text, sizeof text,
                          "epoch %lld/%lld, step %lld/%lld (%d%%): loss %.4f (rank 0, mean of the last %lld steps), "
                          "%.1f samples/s, ETA epoch %s, run %s",
                          static_cast<long long>(p.epoch + 1), static_cast<long long>(o.epochs),
                          static_cast<long long>(p.step_in_epoch), static_cast<long long>(steps_per_epoch_),
                          static_cast<int>(100 * p.step_in_epoch / steps_per_epoch_), loss_mean,
                          static_cast<long long>(window.steps), samples_per_s,
                          clock_text(static_cast<double>(left_in_epoch) / rate).c_str(),
                          clock_text(static_cast<double>(left) / rate).c_str());
            on_note(text);
          }
          logs.line({{"kind", "log"}, {"epoch", p.epoch + 1}, {"step", p.step_in_epoch}, {"global_step", p.global_step},
                     {"train_loss", loss_mean}, {"window_steps", window.steps}, {"samples_per_s", samples_per_s},
                     {"lr", p.lr}});
          logs.scalar("train/loss", loss_mean, p.global_step);
          logs.scalar("train/samples_per_s", samples_per_s, p.global_step);
          logs.scalar("train/lr", p.lr, p.global_step);
          window = Window{};
        }
      }
      if (first_step_unix_s == 0) first_step_unix_s = detail::unix_seconds();
      const bool due = o.save_every_steps > 0 && p.global_step % o.save_every_steps == 0;
      if (snapshots && (stop || due)) {
        p.seconds += elapsed();
        auto hold = batches.pause();  // HDF5 is not thread-safe: the reader waits
        result.last_snapshot = save(with_scaler_state(p));
        t0 = std::chrono::steady_clock::now();
      }
      if (stop) {
        detail::StopSignals::stopping(static_cast<int>(stop));  // this rank too is on its way out
        result.stop_signal = static_cast<int>(stop);
        result.global_step = p.global_step;
        note("stopped by " + std::string(detail::signal_name(result.stop_signal)) + " at global step " +
             std::to_string(p.global_step) + " (epoch " + std::to_string(p.epoch + 1) + ", step " +
             std::to_string(p.step_in_epoch) + ")" +
             (snapshots ? "; snapshot " + result.last_snapshot + " written: rerun with --resume auto to continue"
                        : "; no snapshot directory, so nothing was saved"));
        return result;
      }
    }
    p.seconds += elapsed();
    const int64_t steps = p.step_in_epoch - first, taken = p.step_in_epoch - (p.skipped - skipped_before);
    EpochMetrics m;
    m.epoch = p.epoch + 1;
    m.steps = p.step_in_epoch;
    m.global_step = p.global_step;
    m.lr = p.lr;
    m.skipped_steps = p.skipped - skipped_before;
    m.overflow_steps = p.overflow - overflow_before;
    if (scaler) m.loss_scale = scaler->scale_value();
    if (result.epochs.empty()) m.first_step_unix_s = first_step_unix_s;  // this run's first epoch
    m.seconds = p.seconds;
    auto mean_loss =
        torch::tensor({taken > 0 ? p.loss_sum / static_cast<double>(taken) : 0.0}, torch::kDouble).to(device);
    pg_.allreduce(mean_loss, ReduceOp::kAvg);
    m.train_loss = mean_loss.cpu().item<double>();
    m.samples_per_s = p.seconds > 0 ? static_cast<double>(steps * o.batch_size * runtime_.size()) / p.seconds : 0;
    if (test_) {
      auto hold = batches.pause();
      std::tie(m.test_loss, m.test_accuracy) = evaluate();
    }
    // Every rank took the same steps of the same size (the per-step agreement keeps them in
    // lockstep), so rank 0 writes every rank's line itself: no gather, one collective fewer.
    std::vector<std::string> lines;
    for (int r = 0; runtime_.rank() == 0 && r < runtime_.size(); ++r) {
      lines.push_back("[RANK " + std::to_string(r) + "] Epoch " + std::to_string(p.epoch + 1) +
                      " | Batchsize: " + std::to_string(o.batch_size) + " | Steps: " + std::to_string(p.step_in_epoch));
    }
    if (runtime_.rank() == 0) {
      nlohmann::json j = {{"kind", "epoch"}, {"epoch", m.epoch}, {"steps", m.steps}, {"global_step", m.global_step},
                          {"train_loss", m.train_loss}, {"samples_per_s", m.samples_per_s}, {"seconds", m.seconds},
                          {"lr", m.lr}, {"world_size", runtime_.size()}, {"skipped_steps", m.skipped_steps}};
      if (m.first_step_unix_s > 0) j["first_step_unix_s"] = m.first_step_unix_s;
      if (test_) j["test_loss"] = m.test_loss;
      if (test_ && train_->info().classification) j["test_accuracy"] = m.test_accuracy;
      if (scaler) {
        j["loss_scale"] = m.loss_scale;
        j["overflow_steps"] = m.overflow_steps;
      }
      logs.line(j);
      // The same numbers as TensorBoard scalars epoch/<key>, at the epoch's last global step.
      for (const char* key : {"train_loss", "test_loss", "test_accuracy", "samples_per_s", "seconds", "lr", "loss_scale"}) {
        if (j.contains(key)) logs.scalar(std::string("epoch/") + key, j[key].get<double>(), m.global_step);
      }
    }
    result.epochs.push_back(m);
    if (on_epoch) {
      auto hold = batches.pause();  // the callback may use HDF5 too
      on_epoch(m, lines);
    }
    const bool due = o.save_every > 0 && (p.epoch + 1) % o.save_every == 0;
    const bool last = p.epoch + 1 == o.epochs || p.global_step >= total_steps;
    if (snapshots && (due || last)) {  // may replace a step snapshot of the same step: this form starts the next epoch
      Progress next = p;  // the epoch is complete: the snapshot starts the next one
      ++next.epoch;
      next.step_in_epoch = 0;
      next.loss_sum = next.seconds = 0;
      auto hold = batches.pause();
      result.last_snapshot = save(with_scaler_state(next));
    }
  }
  result.global_step = p.global_step;
  return result;
}

}  // namespace mpiddp
